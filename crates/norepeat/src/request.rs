//! What a guard reads of a request's head besides its caller: the path the
//! client sent.
//!
//! A router that nests routes hands the inner service a shortened URI:
//! inside axum's `Router::nest("/orders/{id}", ...)` every order's
//! `POST /orders/{id}/pay` arrives as `/pay`. A guard that keyed on that
//! would take `/orders/2/pay` for a repeat of `/orders/1/pay`. Every guard
//! in this crate (the Idempotency-Key and fingerprint layers, the
//! [`ByRoute`](crate::ratelimit::ByRoute) rate-limit key) reads the path
//! through [`client_path`] instead.
//!
//! # Other tower stacks
//! axum's router records the URI it received, before any nesting strips
//! it, as the `axum::extract::OriginalUri` extension (axum 0.8, feature
//! `original-uri`, on by default and turned on by this crate). A stack that
//! rewrites the path some other way must either put the guard outside the
//! rewrite or insert that extension, holding the client's URI, before the
//! rewrite:
//!
//! ```
//! use axum::extract::OriginalUri;
//! let mut req = http::Request::builder().uri("/orders/2/pay").body(()).unwrap();
//! let sent = req.uri().clone();
//! req.extensions_mut().insert(OriginalUri(sent));
//! *req.uri_mut() = "/pay".parse().unwrap(); // your stack's rewrite
//! let (parts, _) = req.into_parts();
//! assert_eq!(norepeat::request::client_path(&parts), "/orders/2/pay");
//! ```

use axum::extract::OriginalUri;
use http::request::Parts;

/// The path the client sent: the `OriginalUri` extension's when a router
/// recorded one, else the request's own.
///
/// ```
/// use axum::{Router, extract::Request, routing::post};
/// use tower::ServiceExt;
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let inner = Router::new().route("/pay", post(|req: Request| async move {
///     let (parts, _) = req.into_parts();
///     // The nested router sees `/pay`; the client sent `/orders/2/pay`.
///     assert_eq!(parts.uri.path(), "/pay");
///     norepeat::request::client_path(&parts).to_owned()
/// }));
/// let app: Router = Router::new().nest("/orders/{id}", inner);
/// let req = Request::post("/orders/2/pay").body(axum::body::Body::empty()).unwrap();
/// let res = app.oneshot(req).await.unwrap();
/// let body = axum::body::to_bytes(res.into_body(), 64).await.unwrap();
/// assert_eq!(body, "/orders/2/pay");
/// # }
/// ```
#[must_use]
pub fn client_path(parts: &Parts) -> &str {
    match parts.extensions.get::<OriginalUri>() {
        Some(OriginalUri(uri)) => uri.path(),
        None => parts.uri.path(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_the_extension_the_request_path() {
        let req = http::Request::builder().uri("/a/b?x=1").body(()).unwrap();
        assert_eq!(client_path(&req.into_parts().0), "/a/b");
    }
}
