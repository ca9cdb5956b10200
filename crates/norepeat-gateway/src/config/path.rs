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
            .is_some_and(|last| last == "." || last == "..");
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
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
    rest.split('/').all(|s| !matches!(s, "" | "." | ".."))
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
