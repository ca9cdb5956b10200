//! A request path as routes see it: normalized as RFC 3986 §6 says, with
//! repeated slashes merged, as Envoy's `normalize_path` and
//! `merge_slashes` do.

use std::borrow::Cow;

/// `path` normalized: percent-encoded unreserved characters decoded
/// (`%6D` is `m`, `%2E` is `.`) and every other percent-encoding written in
/// upper case (`%2f` is `%2F`; RFC 3986 §6.2.2.1-2), dot segments removed
/// (`/a/./b/../c` is `/a/c`; §5.2.4), and runs of `/` merged into one. A
/// trailing slash stays (`/a/` is not `/a` here; a route's match ignores
/// it, see [`RouteMatch::matches`](super::RouteMatch::matches)). An encoded
/// slash (`%2F`) stays encoded, as Envoy keeps it by default: it is no
/// segment separator. A path that is already normal is returned as it is,
/// without a copy.
///
/// ```
/// use norepeat_gateway::config::normalize_path;
///
/// for variant in ["/payments", "//payments", "/./payments", "/pay%6Dents", "/a/../payments"] {
///     assert_eq!(normalize_path(variant), "/payments", "{variant}");
/// }
/// assert_eq!(normalize_path("/payments/"), "/payments/");
/// assert_eq!(normalize_path("/a/%2e%2E/b%2f"), "/b%2F");
/// assert_eq!(normalize_path("/../.."), "/");
/// ```
#[must_use]
pub fn normalize_path(path: &str) -> Cow<'_, str> {
    if is_normal(path) {
        return Cow::Borrowed(path);
    }
    let decoded = decode_unreserved(path);
    let trailing = decoded.ends_with('/')
        || decoded
            .rsplit('/')
            .next()
            .is_some_and(|last| matches!(dot(last), "." | ".."));
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match (segment, dot(segment)) {
            ("", _) | (_, ".") => {}
            (_, "..") => {
                segments.pop();
            }
            (s, _) => segments.push(s),
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    if out.is_empty() || trailing {
        out.push('/');
    }
    Cow::Owned(out)
}

/// A segment without its `;` parameters: `..;x` is a dot segment to a
/// back end that drops parameters before it resolves dots (Tomcat), so it
/// is one here too.
fn dot(segment: &str) -> &str {
    segment.split_once(';').map_or(segment, |(name, _)| name)
}

/// No `%`, no empty segment but a trailing one, no dot segment: nothing to
/// normalize (the common case, checked without allocating).
fn is_normal(path: &str) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    if path.contains('%') {
        return false;
    }
    if rest.is_empty() {
        return true;
    }
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    rest.split('/').all(|s| !matches!(dot(s), "" | "." | ".."))
}

/// The one spelling of a normalized `path` that a route's guards key on:
/// without each segment's `;` parameters and without a trailing slash, the
/// parts a route's match ignores. So `/payments`, `/payments/` and
/// `/payments;jsessionid=A1`, one route to a back end that serves them
/// alike, are one key and one fingerprint, not three.
///
/// ```
/// use norepeat_gateway::config::route_spelling;
/// for p in ["/payments", "/payments/", "/payments;jsessionid=A1", "/payments;x/"] {
///     assert_eq!(route_spelling(p), "/payments", "{p}");
/// }
/// assert_eq!(route_spelling("/orders;v=1/7/pay"), "/orders/7/pay");
/// assert_eq!(route_spelling("/"), "/");
/// ```
#[must_use]
pub fn route_spelling(path: &str) -> Cow<'_, str> {
    let trimmed = match path.strip_suffix('/') {
        Some(t) if !t.is_empty() => t,
        _ => path,
    };
    if !trimmed.contains(';') {
        return Cow::Borrowed(trimmed);
    }
    let mut out = String::with_capacity(trimmed.len());
    for (i, segment) in trimmed.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        out.push_str(dot(segment));
    }
    Cow::Owned(out)
}

/// `path` without a format suffix on its last segment (`/payments.json`
/// is `/payments`): Rails, and Spring before 5.3, serve both as one
/// resource. `None` when the last segment has none (an extension of 1 to
/// 8 letters or digits after a name).
///
/// ```
/// use norepeat_gateway::config::without_format_suffix;
/// assert_eq!(without_format_suffix("/payments.json").as_deref(), Some("/payments"));
/// assert_eq!(without_format_suffix("/a/b.xml/").as_deref(), Some("/a/b/"));
/// assert_eq!(without_format_suffix("/payments"), None);
/// assert_eq!(without_format_suffix("/.json"), None);
/// ```
#[must_use]
pub fn without_format_suffix(path: &str) -> Option<String> {
    if !path.contains('.') {
        return None;
    }
    let trailing = path.len() > 1 && path.ends_with('/');
    let body = if trailing {
        &path[..path.len() - 1]
    } else {
        path
    };
    let (dir, last) = body.rsplit_once('/')?;
    let name = dot(last);
    let (stem, ext) = name.rsplit_once('.')?;
    let is_ext =
        !ext.is_empty() && ext.len() <= 8 && ext.bytes().all(|b| b.is_ascii_alphanumeric());
    if stem.is_empty() || !is_ext {
        return None;
    }
    let params = &last[name.len()..];
    Some(format!(
        "{dir}/{stem}{params}{}",
        if trailing { "/" } else { "" }
    ))
}

/// `path` with its encoded slashes (`%2F`) decoded and normalized again:
/// what a back end that decodes them (Flask, Express) takes it for. `None`
/// when it has none.
#[must_use]
pub fn with_slashes_decoded(path: &str) -> Option<String> {
    let encoded = |w: &[u8]| w[0] == b'%' && w[1] == b'2' && w[2].eq_ignore_ascii_case(&b'f');
    if !path.as_bytes().windows(3).any(encoded) {
        return None;
    }
    let decoded = path.replace("%2F", "/").replace("%2f", "/");
    Some(normalize_path(&decoded).into_owned())
}

/// A site (a `Host` header, an `:authority`, a route's `host`) in one
/// spelling: its name in ASCII lower case, a trailing dot and any port
/// dropped, so `Shop.Example`, `shop.example.` and `shop.example:8443` are
/// one site. The port is not the site's: instances of one gateway listen
/// on ports of their own, and a client that reached one directly must
/// meet the keys of another. `None` when it names none.
///
/// ```
/// use norepeat_gateway::config::normalize_host;
/// assert_eq!(normalize_host("Shop.Example.:443").as_deref(), Some("shop.example"));
/// assert_eq!(normalize_host("shop.example:8080").as_deref(), Some("shop.example"));
/// assert_eq!(normalize_host("[::1]:8080").as_deref(), Some("[::1]"));
/// assert_eq!(normalize_host(""), None);
/// ```
#[must_use]
pub fn normalize_host(raw: &str) -> Option<String> {
    host_span(raw).map(str::to_ascii_lowercase)
}

/// The part of `raw` that names its site, before [`normalize_host`]
/// lower-cases it: trimmed, without a port or a trailing dot; `None` when
/// nothing is left. Case changes none of these cuts, so the gateway's hot
/// path lower-cases the span where it likes (on the stack) and gets
/// [`normalize_host`]'s spelling.
pub(crate) fn host_span(raw: &str) -> Option<&str> {
    let raw = raw.trim();
    let name = match raw.rsplit_once(':') {
        // `[::1]:8080`, `shop.example:8080`; a bare IPv6 literal is
        // bracketed, so its colons are inside the brackets.
        Some((name, port)) if !port.contains(']') => name,
        _ => raw,
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    (!name.is_empty()).then_some(name)
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Decodes `%XX` of unreserved characters, upper-cases the others; an
/// invalid `%` is kept as it is.
fn decode_unreserved(path: &str) -> String {
    let b = path.as_bytes();
    let mut out = String::with_capacity(path.len() + 1);
    if !path.starts_with('/') {
        out.push('/');
    }
    let hex = |c: u8| char::from(c).to_digit(16);
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let (Some(&h), Some(&l)) = (b.get(i + 1), b.get(i + 2))
            && let (Some(hv), Some(lv)) = (hex(h), hex(l))
        {
            // Two hex digits: at most 255.
            let byte = u8::try_from(hv * 16 + lv).unwrap_or(0);
            if is_unreserved(byte) {
                out.push(char::from(byte));
            } else {
                out.push('%');
                out.push(char::from(h.to_ascii_uppercase()));
                out.push(char::from(l.to_ascii_uppercase()));
            }
            i += 3;
            continue;
        }
        // The path of a URI is ASCII; anything else is copied as it is.
        let len = path[i..].chars().next().map_or(1, char::len_utf8);
        out.push_str(&path[i..i + len]);
        i += len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::normalize_path;
    use std::borrow::Cow;

    #[test]
    fn rfc_3986_and_merged_slashes() {
        for (raw, want) in [
            ("/", "/"),
            ("", "/"),
            ("//", "/"),
            ("/payments", "/payments"),
            ("/payments/", "/payments/"),
            ("//payments", "/payments"),
            ("/payments//", "/payments/"),
            ("/a//b///c", "/a/b/c"),
            ("/./payments", "/payments"),
            ("/payments/.", "/payments/"),
            ("/x/../payments", "/payments"),
            ("/../payments", "/payments"),
            ("/a/b/..", "/a/"),
            ("/pay%6Dents", "/payments"),
            ("/pay%6dents", "/payments"),
            ("/%2E/payments", "/payments"),
            ("/x/%2e%2e/payments", "/payments"),
            ("/a%2fb", "/a%2Fb"),
            ("/x/..;/payments", "/payments"),
            ("/x/..;jsessionid=1/payments", "/payments"),
            ("/.;x/payments", "/payments"),
            ("/payments/..;", "/"),
            ("/a%zz", "/a%zz"),
            ("/a%4", "/a%4"),
            ("/%7E%41", "/~A"),
            ("/a%20b", "/a%20b"),
            ("/...", "/..."),
        ] {
            assert_eq!(normalize_path(raw), want, "{raw:?}");
        }
    }

    #[test]
    fn a_normal_path_is_not_copied() {
        for p in ["/", "/payments", "/payments/", "/a/b.c/d"] {
            assert!(matches!(normalize_path(p), Cow::Borrowed(_)), "{p}");
        }
    }

    #[test]
    fn normalizing_twice_changes_nothing() {
        for p in ["//a/./b/../c/", "/%2e%2E/x%2f/", "/a/%7e/..", "/a%25%32%46"] {
            let once = normalize_path(p).into_owned();
            assert_eq!(normalize_path(&once), once, "{p}");
        }
    }
}
