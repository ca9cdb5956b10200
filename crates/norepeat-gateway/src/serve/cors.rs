//! CORS (`cors: { allow_origins: [...] }`): the pages of the listed
//! origins may call the routes and `GET /.norepeat/token` with their
//! cookies (`credentials: "include"`), so a cookie identity works from
//! them.
//!
//! Only a listed origin is echoed in `Access-Control-Allow-Origin` (never
//! `*`, which a browser refuses with credentials), with
//! `Access-Control-Allow-Credentials: true`.
//!
//! | request | answer |
//! |---|---|
//! | a listed origin's request a route takes | the route's answer (the backend's, a replay, a refusal) with the headers above, its `Access-Control-Expose-Headers` naming the guards' headers ([`EXPOSED`]) besides the backend's own, `Vary: Origin` |
//! | a listed origin's request the gateway answers itself (a 409, 422, 429, 502, ...) | the same |
//! | a listed origin's preflight (`OPTIONS` with `Access-Control-Request-Method`) for a route | 204 from the gateway, the backend never asked: the method and the headers asked for allowed, kept 10 minutes |
//! | another origin's request | the answer as it was, `Vary: Origin` added; its preflight goes to the backend |
//! | an unmatched request (no route) | the backend's answer as it was |
//! | `GET /.norepeat/token`, its preflight | the same rules; any origin's preflight is the gateway's (204, without the headers for another origin) |
//!
//! A backend that sends CORS headers itself: on an answer to a listed
//! origin the gateway's `Access-Control-Allow-Origin` and `-Credentials`
//! replace the backend's (one of each, never two), and its
//! `Access-Control-Expose-Headers` are kept, with the gateway's added.
//! Answers to other origins keep the backend's.

use axum::body::Body;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};

/// How long a browser may keep a preflight's answer (10 minutes).
const MAX_AGE: &str = "600";

/// The headers of the gateway's and its guards' answers a page's script
/// may read: a replay's mark, when to come back, the rate limit's state,
/// the request's id.
pub(crate) const EXPOSED: [&str; 5] = [
    "Idempotent-Replayed",
    "Retry-After",
    "RateLimit",
    "RateLimit-Policy",
    "X-Request-Id",
];

/// Whether `origin` is one of `allowed` (an origin is compared in lower
/// case, as the file's are kept).
pub(crate) fn listed<'a>(
    allowed: &[String],
    origin: Option<&'a HeaderValue>,
) -> Option<&'a HeaderValue> {
    let o = origin?;
    let s = o.to_str().ok()?;
    allowed
        .iter()
        .any(|a| a.eq_ignore_ascii_case(s))
        .then_some(o)
}

/// Adds the CORS headers of an answer to `origin` (none without `cors`).
pub(crate) fn allow(allowed: &[String], origin: Option<&HeaderValue>, headers: &mut HeaderMap) {
    if allowed.is_empty() {
        return;
    }
    headers.append(header::VARY, HeaderValue::from_static("Origin"));
    if let Some(o) = listed(allowed, origin) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, o.clone());
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
            HeaderValue::from_static("true"),
        );
    }
}

/// The answer to a preflight, or `None` without `cors` (then `OPTIONS` is
/// not allowed).
pub(crate) fn preflight(allowed: &[String], request: &HeaderMap) -> Option<Response<Body>> {
    if allowed.is_empty() {
        return None;
    }
    let mut res = Response::new(Body::empty());
    *res.status_mut() = StatusCode::NO_CONTENT;
    let origin = request.get(header::ORIGIN);
    let asks_get = request
        .get(header::ACCESS_CONTROL_REQUEST_METHOD)
        .is_some_and(|m| m.as_bytes() == b"GET");
    let h = res.headers_mut();
    h.insert(header::ALLOW, HeaderValue::from_static("GET, OPTIONS"));
    if asks_get {
        allow(allowed, origin, h);
    } else {
        h.append(header::VARY, HeaderValue::from_static("Origin"));
    }
    if h.contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN) {
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET"),
        );
        // The headers that name the caller (X-User-Id, Authorization) are
        // the page's to send.
        if let Some(asked) = request.get(header::ACCESS_CONTROL_REQUEST_HEADERS) {
            h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked.clone());
        }
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static(MAX_AGE),
        );
    }
    Some(res)
}

/// The CORS headers of a route's answer (or the gateway's own) to
/// `origin`, a listed one: the backend's `Allow-Origin` and
/// `Allow-Credentials` replaced, its `Expose-Headers` kept with
/// [`EXPOSED`] added, `Vary: Origin`.
pub(crate) fn for_listed(origin: &HeaderValue, headers: &mut HeaderMap) {
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
        HeaderValue::from_static("true"),
    );
    let mut names: Vec<String> = headers
        .get_all(header::ACCESS_CONTROL_EXPOSE_HEADERS)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect();
    for ours in EXPOSED {
        if !names.iter().any(|n| n.eq_ignore_ascii_case(ours)) {
            names.push(ours.to_owned());
        }
    }
    // Header names and commas: always a valid value.
    if let Ok(v) = HeaderValue::from_str(&names.join(", ")) {
        headers.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, v);
    }
    vary_origin(headers);
}

/// Adds `Origin` to `Vary` unless it (or `*`) is there: an answer whose
/// headers depend on the origin is never handed by a cache to another.
pub(crate) fn vary_origin(headers: &mut HeaderMap) {
    let there = headers
        .get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|n| n.trim() == "*" || n.trim().eq_ignore_ascii_case("origin"));
    if !there {
        headers.append(header::VARY, HeaderValue::from_static("Origin"));
    }
}

/// The gateway's answer to a preflight for a route, whose `Origin` the
/// route phase found listed: 204 with the method and the headers it asks
/// for allowed (a route takes that method on that path; the guard's
/// headers, `Idempotency-Key`, `Repeat-Token`, and the caller's are the
/// page's to send).
pub(crate) fn route_preflight(request: &HeaderMap) -> Response<Body> {
    let mut res = Response::new(Body::empty());
    *res.status_mut() = StatusCode::NO_CONTENT;
    let h = res.headers_mut();
    if let Some(origin) = request.get(header::ORIGIN) {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
    }
    h.insert(
        header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
        HeaderValue::from_static("true"),
    );
    if let Some(method) = request.get(header::ACCESS_CONTROL_REQUEST_METHOD) {
        h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, method.clone());
    }
    if let Some(asked) = request.get(header::ACCESS_CONTROL_REQUEST_HEADERS) {
        h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked.clone());
    }
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static(MAX_AGE),
    );
    h.insert(header::VARY, HeaderValue::from_static("Origin"));
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    http::HeaderName::from_static(k),
                    HeaderValue::from_static(v),
                )
            })
            .collect()
    }

    #[test]
    fn only_a_listed_origin_is_echoed() {
        let allowed = vec!["https://shop.example".to_owned()];
        let mut h = HeaderMap::new();
        let o = HeaderValue::from_static("https://shop.example");
        allow(&allowed, Some(&o), &mut h);
        assert_eq!(
            h[header::ACCESS_CONTROL_ALLOW_ORIGIN],
            "https://shop.example"
        );
        assert_eq!(h[header::ACCESS_CONTROL_ALLOW_CREDENTIALS], "true");
        assert_eq!(h[header::VARY], "Origin");
        let mut h = HeaderMap::new();
        let evil = HeaderValue::from_static("https://shop.example.evil");
        allow(&allowed, Some(&evil), &mut h);
        assert!(!h.contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN));
        assert_eq!(h[header::VARY], "Origin");
        let mut h = HeaderMap::new();
        allow(&[], Some(&o), &mut h);
        assert!(h.is_empty(), "no cors, no headers");
    }

    #[test]
    fn a_preflight_allows_what_a_listed_origin_asks() {
        let allowed = vec!["https://shop.example".to_owned()];
        let res = preflight(
            &allowed,
            &headers(&[
                ("origin", "https://shop.example"),
                ("access-control-request-method", "GET"),
                ("access-control-request-headers", "x-user-id"),
            ]),
        )
        .unwrap();
        assert_eq!(res.status(), 204);
        let h = res.headers();
        assert_eq!(
            h[header::ACCESS_CONTROL_ALLOW_ORIGIN],
            "https://shop.example"
        );
        assert_eq!(h[header::ACCESS_CONTROL_ALLOW_HEADERS], "x-user-id");
        assert_eq!(h[header::ACCESS_CONTROL_ALLOW_METHODS], "GET");
        let post = preflight(
            &allowed,
            &headers(&[
                ("origin", "https://shop.example"),
                ("access-control-request-method", "POST"),
            ]),
        )
        .unwrap();
        assert!(
            !post
                .headers()
                .contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN)
        );
        assert!(preflight(&[], &HeaderMap::new()).is_none());
    }

    #[test]
    fn a_listed_origin_replaces_the_backends_own_and_keeps_its_exposed_headers() {
        let o = HeaderValue::from_static("https://shop.example");
        let mut h = headers(&[
            ("access-control-allow-origin", "*"),
            ("access-control-expose-headers", "X-Order, retry-after"),
            ("vary", "Accept-Encoding, origin"),
        ]);
        for_listed(&o, &mut h);
        let all = |name: http::header::HeaderName| -> Vec<String> {
            h.get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(
            all(header::ACCESS_CONTROL_ALLOW_ORIGIN),
            ["https://shop.example"]
        );
        assert_eq!(all(header::ACCESS_CONTROL_ALLOW_CREDENTIALS), ["true"]);
        assert_eq!(
            all(header::ACCESS_CONTROL_EXPOSE_HEADERS),
            [
                "X-Order, retry-after, Idempotent-Replayed, RateLimit, RateLimit-Policy, X-Request-Id"
            ]
        );
        assert_eq!(
            all(header::VARY),
            ["Accept-Encoding, origin"],
            "Origin once"
        );
        // Twice over is the same: nothing doubles.
        for_listed(&o, &mut h);
        assert_eq!(
            h.get_all(header::ACCESS_CONTROL_EXPOSE_HEADERS)
                .iter()
                .count(),
            1
        );
        assert_eq!(h.get_all(header::VARY).iter().count(), 1);
        let mut bare = HeaderMap::new();
        vary_origin(&mut bare);
        assert_eq!(bare[header::VARY], "Origin");
    }

    #[test]
    fn a_routes_preflight_allows_the_method_and_headers_asked() {
        let res = route_preflight(&headers(&[
            ("origin", "https://shop.example"),
            ("access-control-request-method", "POST"),
            (
                "access-control-request-headers",
                "content-type, idempotency-key",
            ),
        ]));
        assert_eq!(res.status(), 204);
        let h = res.headers();
        assert_eq!(
            h[header::ACCESS_CONTROL_ALLOW_ORIGIN],
            "https://shop.example"
        );
        assert_eq!(h[header::ACCESS_CONTROL_ALLOW_METHODS], "POST");
        assert_eq!(
            h[header::ACCESS_CONTROL_ALLOW_HEADERS],
            "content-type, idempotency-key"
        );
        assert_eq!(h[header::ACCESS_CONTROL_ALLOW_CREDENTIALS], "true");
        assert_eq!(h[header::ACCESS_CONTROL_MAX_AGE], "600");
    }
}
