//! CORS for `GET /.norepeat/token` (`cors: { allow_origins: [...] }`): a
//! page on another origin fetches its token with its cookies
//! (`credentials: "include"`), so the cookie identity works from it.
//!
//! Only a listed origin is echoed in `Access-Control-Allow-Origin` (never
//! `*`, which a browser refuses with credentials), with
//! `Access-Control-Allow-Credentials: true`; every answer says `Vary:
//! Origin`, so a cache never hands one origin's answer to another. A
//! preflight (`OPTIONS` with `Access-Control-Request-Method: GET`) from a
//! listed origin is answered 204 with the headers it asked for allowed;
//! from any other origin 204 without them, which the browser refuses.

use axum::body::Body;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};

/// How long a browser may keep a preflight's answer (10 minutes).
const MAX_AGE: &str = "600";

/// Whether `origin` is one of `allowed` (an origin is compared in lower
/// case, as the file's are kept).
fn listed<'a>(allowed: &[String], origin: Option<&'a HeaderValue>) -> Option<&'a HeaderValue> {
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
}
