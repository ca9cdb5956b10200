//! The head phase: what the gateway refuses from a request's head alone
//! (a target or a Host a backend could read otherwise, a method not in
//! upper case), and what it drops from it before anything else reads it
//! (the headers a client's `Connection` names, the `Upgrade`s the file
//! does not forward).

use crate::config::normalize_host;
use crate::serve::http1::protocol_name;
use axum::body::Body;
use http::{HeaderName, Request};

/// Removes the headers the client's `Connection` names (RFC 9110 §7.6.1),
/// and leaves in `Connection` only the options the gateway reads itself
/// (`close`, `keep-alive`, `upgrade`): what it names is gone before the
/// gateway adds its own headers, so a client can never have one of those
/// removed (`Connection: Idempotency-Attempt`). The fixed hop-by-hop
/// headers are dropped on the way out (`upstream`).
pub(crate) fn drop_nominated(headers: &mut http::HeaderMap) {
    let Some(first) = headers.get(http::header::CONNECTION) else {
        return;
    };
    let options = |t: &str| {
        t.eq_ignore_ascii_case("close")
            || t.eq_ignore_ascii_case("keep-alive")
            || t.eq_ignore_ascii_case("upgrade")
    };
    // The common values (`keep-alive`, `close`, `Upgrade`): nothing to do.
    let one = headers.get_all(http::header::CONNECTION).iter().count() == 1;
    if one
        && first
            .to_str()
            .is_ok_and(|v| v.split(',').map(str::trim).all(options))
    {
        return;
    }
    let mut named = Vec::new();
    let mut kept: Vec<&'static str> = Vec::new();
    for token in headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
    {
        for (option, spelled) in [
            ("close", "close"),
            ("keep-alive", "keep-alive"),
            ("upgrade", "upgrade"),
        ] {
            if token.eq_ignore_ascii_case(option) && !kept.contains(&spelled) {
                kept.push(spelled);
            }
        }
        if !options(token)
            && let Ok(n) = HeaderName::from_bytes(token.as_bytes())
            && n != http::header::HOST
        {
            named.push(n);
        }
    }
    for n in named {
        headers.remove(n);
    }
    headers.remove(http::header::CONNECTION);
    if !kept.is_empty()
        && let Ok(v) = http::HeaderValue::from_str(&kept.join(", "))
    {
        headers.insert(http::header::CONNECTION, v);
    }
}

/// Leaves in `Upgrade` only the protocols `allowed` names (the file's
/// `upgrades`; `h2c` never is), or removes it, and `upgrade` from
/// `Connection`, when none is left: such a request goes on as a plain one,
/// as NGINX sends it without `Upgrade` unless told to.
pub(crate) fn only_allowed_upgrades(headers: &mut http::HeaderMap, allowed: &[String]) {
    let asked: Vec<String> = headers
        .get_all(http::header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect();
    let kept: Vec<&str> = asked
        .iter()
        .filter(|p| allowed.contains(&protocol_name(p)))
        .map(String::as_str)
        .collect();
    if kept.len() == asked.len() && !kept.is_empty() {
        return;
    }
    headers.remove(http::header::UPGRADE);
    if kept.is_empty() {
        tracing::debug!(asked = ?asked, "an Upgrade not in `upgrades`: forwarded without it");
        let rest: Vec<String> = headers
            .get_all(http::header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|s| s.split(','))
            .map(str::trim)
            .filter(|t| !t.is_empty() && !t.eq_ignore_ascii_case("upgrade"))
            .map(str::to_owned)
            .collect();
        headers.remove(http::header::CONNECTION);
        if let Ok(v) = http::HeaderValue::from_str(&rest.join(", "))
            && !rest.is_empty()
        {
            headers.insert(http::header::CONNECTION, v);
        }
    } else if let Ok(v) = http::HeaderValue::from_str(&kept.join(", ")) {
        headers.insert(http::header::UPGRADE, v);
    }
}

/// The forwarding headers a client outside `trusted_proxies` may not set.
pub(crate) static FORWARDING: [HeaderName; 4] = [
    http::header::FORWARDED,
    crate::serve::upstream::headers::X_FORWARDED_FOR,
    crate::serve::upstream::headers::X_FORWARDED_HOST,
    crate::serve::upstream::headers::X_FORWARDED_PROTO,
];

/// Why `req` is not forwarded, if it is one a backend could read otherwise
/// than the gateway did (RFC 9112 asks a server to answer these 400). Both
/// `Content-Length` and `Transfer-Encoding` need no check here: hyper reads
/// such a body by the latter and drops the former. A request without a
/// `Host` is forwarded (the upstream's host is sent): a request built in
/// process, as tests and embedders make them, has none.
pub(crate) fn not_forwarded(req: &Request<Body>) -> Option<&'static str> {
    // The Host looked up once: the first, and how many there are.
    let mut all_hosts = req.headers().get_all(http::header::HOST).iter();
    let host = all_hosts.next();
    let hosts = usize::from(host.is_some()) + all_hosts.count();
    if !req.uri().path().starts_with('/') {
        Some(
            "The gateway forwards requests for a path (a target starting with /); `*` and other forms are not forwarded.",
        )
    } else if req
        .method()
        .as_str()
        .bytes()
        .any(|b| b.is_ascii_lowercase())
    {
        // Methods are case-sensitive (RFC 9110 §9.1), but the backends in
        // front of which the gateway stands are not all so: werkzeug takes
        // `post` for POST. A spelling the backend takes alike must not pass
        // unguarded, so none but the upper case passes.
        Some("The method must be in upper case (`POST`, not `post`).")
    } else if hosts > 1 {
        Some("The request carries more than one Host header.")
    } else if let Some(host) = host
        && !host.as_bytes().iter().all(u8::is_ascii_graphic)
    {
        // The site keys and routes are chosen by; a byte a backend reads
        // its own way has no place in it.
        Some("The Host header must be visible ASCII.")
    } else if let Some(host) = host
        && (host.as_bytes().contains(&b'@') || host.as_bytes().windows(2).any(|w| w == b".."))
    {
        // `x@pay.example` (userinfo, which RFC 9110 §4.2.4 forbids here)
        // and `pay.example..` name a site one reader takes for another.
        Some("The Host header must name a host: no userinfo (@) and no empty label (..).")
    } else if req
        .uri()
        .authority()
        .is_some_and(|a| a.as_str().contains('@') || a.as_str().contains(".."))
    {
        Some(
            "The request target's authority must name a host: no userinfo (@) and no empty label (..).",
        )
    } else if let (Some(authority), Some(host)) = (req.uri().authority(), host)
        && req.version() >= http::Version::HTTP_2
        && host.to_str().ok().and_then(normalize_host) != normalize_host(authority.as_str())
    {
        // RFC 9113 §8.3.1: an HTTP/2 request whose Host names another site
        // than its `:authority` is malformed (the gateway and the backend
        // could each take another). An HTTP/1.1 absolute-form target's
        // authority replaces its Host (RFC 9112 §3.2.2), as `upstream` and
        // `scope::site` both read it.
        Some("The request's Host and its :authority name different sites.")
    } else if hosts == 0
        && req.version() == http::Version::HTTP_11
        && req.uri().authority().is_none()
        && req
            .extensions()
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .is_some()
    {
        // RFC 9112 §3.2: a server answers 400 to an HTTP/1.1 request
        // without Host. (A request made in process, which has no peer,
        // has none either, and goes on.)
        Some("An HTTP/1.1 request must carry a Host header.")
    } else {
        None
    }
}
