// Over 400 lines on purpose: most is the module docs and the known-answer tests of one verifier.
//! Signed webhooks: an HMAC over the raw body and a timestamp.
//!
//! A payment provider's notice changes money and state, so whoever sends it
//! must prove they hold a shared secret. The scheme is the one Stripe uses:
//! the sender puts
//!
//! ```text
//! Norepeat-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + raw body)>
//! ```
//!
//! on the request, and the receiver recomputes the MAC over the bytes it
//! received, compares in constant time and refuses a `t` further than the
//! tolerance (default 300 s) from its clock, so a captured notice cannot be
//! replayed later. Several `v1` entries may be given (while a secret is being
//! rotated); one matching is enough. Unknown entries (`v0=...`) are ignored.
//!
//! The MAC covers the raw bytes: verify before parsing, never over a
//! re-serialised body. This is what a `sign` field inside the body tries to
//! be, done right: a field in the body cannot sign the body it sits in
//! without a canonical form, and it carries no timestamp.
//!
//! ```
//! use norepeat::webhook::{SignatureError, WebhookVerifier};
//!
//! let provider = WebhookVerifier::new("whsec_shared");
//! let shop = WebhookVerifier::new("whsec_shared");
//! let body = br#"{"paymentId":"p-1","status":"SUCCESS"}"#;
//!
//! let now = 1_700_000_000;
//! let header = provider.sign(now, body);
//! assert!(header.starts_with("t=1700000000,v1="));
//! assert_eq!(shop.verify_at(Some(&header), body, now + 10), Ok(()));
//!
//! // Another body, another secret, no header, or too late: refused.
//! assert_eq!(shop.verify_at(Some(&header), b"{}", now), Err(SignatureError::Mismatch));
//! let forged = WebhookVerifier::new("guess").sign(now, body);
//! assert_eq!(shop.verify_at(Some(&forged), body, now), Err(SignatureError::Mismatch));
//! assert_eq!(shop.verify_at(None, body, now), Err(SignatureError::Missing));
//! assert!(matches!(
//!     shop.verify_at(Some(&header), body, now + 301),
//!     Err(SignatureError::Stale { .. })
//! ));
//! ```
//!
//! # As a layer
//! [`WebhookLayer`] verifies before the handler runs and hands the body on
//! unchanged; a refusal is a 401 `invalid_signature` problem+json (413
//! `payload_too_large` past the cap, default 64 KiB). A request without the
//! header is told which one it lacks (`Norepeat-Signature`, or the name set
//! with [`WebhookVerifier::header`]).
//!
//! ```
//! use axum::{Router, body::{Body, Bytes}, http::{Request, StatusCode}, routing::post};
//! use norepeat::webhook::{WebhookLayer, WebhookVerifier, SIGNATURE_HEADER};
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let verifier = WebhookVerifier::new("whsec_shared");
//! let app: Router = Router::new().route(
//!     "/payments/callback",
//!     post(|body: Bytes| async move { format!("got {} bytes", body.len()) })
//!         .layer(WebhookLayer::new(verifier.clone())),
//! );
//!
//! let body = r#"{"paymentId":"p-1","status":"SUCCESS"}"#;
//! let signed = Request::post("/payments/callback")
//!     .header(SIGNATURE_HEADER, verifier.sign_now(body.as_bytes()))
//!     .body(Body::from(body))
//!     .unwrap();
//! assert_eq!(app.clone().oneshot(signed).await.unwrap().status(), StatusCode::OK);
//! let unsigned = Request::post("/payments/callback").body(Body::from(body)).unwrap();
//! assert_eq!(app.oneshot(unsigned).await.unwrap().status(), StatusCode::UNAUTHORIZED);
//! # }
//! ```
//!
//! # Replays within the window
//! A signature proves who sent a notice, not that it is the first
//! delivery: the same notice resent 3 s later verifies again, for the
//! whole tolerance. Opt in to [`WebhookLayer::remember_in`] and the layer
//! records each accepted signature in a store (one `SET NX PX` per `t` and
//! matching `v1`, kept for twice the tolerance, so for as long as it could
//! verify anywhere). A byte-identical replay then gets 409
//! `duplicate_submission` ([`OnReplay::Refuse`]), or reaches the handler
//! marked with a [`Repeated`] extension ([`OnReplay::PassMarked`]), for a
//! handler that answers repeats itself.
//!
//! This catches the replayed *signature*. A provider that delivers the same
//! event again signs it again (a new `t`, a new `v1`): that passes the
//! memory. What makes the *event* take effect once is a guard on its id,
//! `#[norepeat::guard(key = "{event_id}", mode = once)]` on the function
//! that applies it (see [`crate::guard`]), which gives every later delivery
//! the first one's result for its retention (24 h by default, far longer
//! than the window). Together: the once guard is the rule, and the
//! signature memory turns away a captured request replayed inside the
//! window before it reaches any code. Behind a once guard, prefer
//! `PassMarked` (or no memory) when the provider may resend a notice
//! unchanged and expects 2xx: a 409 would read to it as a failure.
//!
//! # In an axum handler
//! Take the body as [`Bytes`](bytes::Bytes), verify, then parse. A refusal
//! converts to a 401 `invalid_signature` [`Problem`](crate::problem::Problem).
//!
//! ```
//! use axum::{Router, body::Bytes, http::HeaderMap, routing::post};
//! use norepeat::problem::Problem;
//! use norepeat::webhook::WebhookVerifier;
//!
//! let verifier = WebhookVerifier::new("whsec_shared");
//! let app: Router = Router::new().route(
//!     "/payments/callback",
//!     post(move |headers: HeaderMap, body: Bytes| async move {
//!         if let Err(e) = verifier.verify_headers(&headers, &body) {
//!             return Problem::from(e).to_response().map(axum::body::Body::new);
//!         }
//!         // ... parse `body` and apply the notice ...
//!         axum::http::Response::new(axum::body::Body::from("ok"))
//!     }),
//! );
//! ```

use hmac::{Hmac, KeyInit, Mac};
use http::{HeaderMap, HeaderName};
use sha2::Sha256;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

mod layer;

pub use crate::middleware::ResponseBody;
pub use layer::{DEFAULT_MAX_BODY, OnReplay, Repeated, Webhook, WebhookLayer};

/// The header carrying the signature (lower case, as `http` spells names).
pub const SIGNATURE_HEADER: &str = "norepeat-signature";

/// The default tolerance between the signature's `t` and the receiver's
/// clock, either way.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

/// Why a signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SignatureError {
    /// No signature header (or one that is not visible ASCII). The
    /// message names the default header; [`WebhookVerifier::problem`]
    /// names the one the verifier reads.
    #[error("the request carries no Norepeat-Signature header")]
    Missing,
    /// The header is not `t=<seconds>,v1=<hex>[,v1=<hex>...]`.
    #[error("the signature header is malformed: {0}")]
    Malformed(&'static str),
    /// `t` is further from now than the tolerance: a late replay, or a clock
    /// far off.
    #[error("the signature is {age_secs} s away from now (tolerance {tolerance_secs} s)")]
    Stale {
        /// How far `t` is from now, in whole seconds.
        age_secs: u64,
        /// The tolerance, in whole seconds.
        tolerance_secs: u64,
    },
    /// No `v1` matches the body: wrong secret, or a body changed on the way.
    #[error("the signature does not match the body")]
    Mismatch,
}

/// Signs and verifies webhook bodies with a shared secret.
///
/// Cheap to clone (the secret is shared). See the [module](self) docs for
/// the scheme.
#[derive(Clone)]
pub struct WebhookVerifier {
    secret: Arc<[u8]>,
    tolerance: Duration,
    header: HeaderName,
}

impl fmt::Debug for WebhookVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookVerifier")
            .field("secret", &"<redacted>")
            .field("tolerance", &self.tolerance)
            .field("header", &self.header)
            .finish()
    }
}

impl WebhookVerifier {
    /// A verifier for `secret`, with the [`DEFAULT_TOLERANCE`].
    ///
    /// ```
    /// use norepeat::webhook::WebhookVerifier;
    /// use std::time::Duration;
    /// let v = WebhookVerifier::new(b"secret").tolerance(Duration::from_secs(60));
    /// let header = v.sign_now(b"{}");
    /// assert!(v.verify(Some(&header), b"{}").is_ok());
    /// ```
    #[must_use]
    pub fn new(secret: impl AsRef<[u8]>) -> Self {
        Self {
            secret: Arc::from(secret.as_ref()),
            tolerance: DEFAULT_TOLERANCE,
            header: HeaderName::from_static(SIGNATURE_HEADER),
        }
    }

    /// The header [`verify_headers`](Self::verify_headers) reads (default
    /// [`SIGNATURE_HEADER`], `Norepeat-Signature`), for a provider that
    /// names it otherwise.
    ///
    /// ```
    /// use norepeat::webhook::WebhookVerifier;
    /// let v = WebhookVerifier::new("s").header(http::HeaderName::from_static("x-provider-signature"));
    /// let mut headers = http::HeaderMap::new();
    /// headers.insert("x-provider-signature", v.sign_now(b"{}").parse().unwrap());
    /// assert!(v.verify_headers(&headers, b"{}").is_ok());
    /// ```
    #[must_use]
    pub fn header(mut self, name: HeaderName) -> Self {
        self.header = name;
        self
    }

    /// The tolerance set with [`tolerance`](Self::tolerance).
    #[must_use]
    pub fn get_tolerance(&self) -> Duration {
        self.tolerance
    }

    /// How far the signature's `t` may be from the receiver's clock, either
    /// way (whole seconds count; default 300 s).
    #[must_use]
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    fn mac(&self, timestamp: u64, body: &[u8]) -> Hmac<Sha256> {
        // HMAC takes a key of any length.
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.secret)
            .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }

    /// The header value signing `body` at `timestamp` (unix seconds):
    /// `t=<timestamp>,v1=<hex>`.
    #[must_use]
    pub fn sign(&self, timestamp: u64, body: &[u8]) -> String {
        let tag = self.mac(timestamp, body).finalize().into_bytes();
        format!("t={timestamp},v1={}", hex::encode(tag))
    }

    /// [`sign`](Self::sign) with the current time.
    #[must_use]
    pub fn sign_now(&self, body: &[u8]) -> String {
        self.sign(unix_now(), body)
    }

    /// Verifies the signature header value against `body` and the current
    /// time.
    ///
    /// # Errors
    /// A [`SignatureError`] saying why the request is refused.
    pub fn verify(&self, header: Option<&str>, body: &[u8]) -> Result<(), SignatureError> {
        self.verify_at(header, body, unix_now())
    }

    /// Verifies the [`SIGNATURE_HEADER`] of a request against its raw body.
    ///
    /// # Errors
    /// A [`SignatureError`] saying why the request is refused.
    pub fn verify_headers(&self, headers: &HeaderMap, body: &[u8]) -> Result<(), SignatureError> {
        self.verified_tag(headers, body, unix_now()).map(|_| ())
    }

    /// Verifies the request's header at `now` and returns what identifies
    /// the notice: its `t` and our MAC over `t` and the body (the `v1` that
    /// matched), whatever else the header carries.
    pub(crate) fn verified_tag(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: u64,
    ) -> Result<(u64, [u8; 32]), SignatureError> {
        let header = match headers.get(&self.header) {
            None => None,
            Some(v) => Some(v.to_str().map_err(|_| SignatureError::Missing)?),
        };
        self.check(header, body, now)
    }

    /// Verifies as if the time were `now` (unix seconds).
    ///
    /// # Errors
    /// A [`SignatureError`] saying why the request is refused.
    pub fn verify_at(
        &self,
        header: Option<&str>,
        body: &[u8],
        now: u64,
    ) -> Result<(), SignatureError> {
        self.check(header, body, now).map(|_| ())
    }

    fn check(
        &self,
        header: Option<&str>,
        body: &[u8],
        now: u64,
    ) -> Result<(u64, [u8; 32]), SignatureError> {
        let header = header.ok_or(SignatureError::Missing)?;
        let mut timestamp = None;
        let mut tags: Vec<&str> = Vec::new();
        for item in header.split(',') {
            let (k, v) = item
                .trim()
                .split_once('=')
                .ok_or(SignatureError::Malformed("an entry is not key=value"))?;
            match k {
                "t" if timestamp.is_some() => {
                    return Err(SignatureError::Malformed("more than one t"));
                }
                "t" => {
                    let t = v
                        .parse::<u64>()
                        .ok()
                        .filter(|_| !v.starts_with('+'))
                        .ok_or(SignatureError::Malformed("t is not unix seconds"))?;
                    timestamp = Some(t);
                }
                "v1" => tags.push(v),
                _ => {}
            }
        }
        let t = timestamp.ok_or(SignatureError::Malformed("no t"))?;
        if tags.is_empty() {
            return Err(SignatureError::Malformed("no v1"));
        }
        let age = now.abs_diff(t);
        if age > self.tolerance.as_secs() {
            return Err(SignatureError::Stale {
                age_secs: age,
                tolerance_secs: self.tolerance.as_secs(),
            });
        }
        let mac = self.mac(t, body);
        let mut ok = false;
        for tag in tags {
            // A tag that is not 64 hex digits cannot match; the comparison of
            // one that is runs in constant time (`verify_slice`).
            if let Ok(bytes) = hex::decode(tag) {
                ok |= mac.clone().verify_slice(&bytes).is_ok();
            }
        }
        if ok {
            Ok((t, mac.finalize().into_bytes().into()))
        } else {
            Err(SignatureError::Mismatch)
        }
    }
}

pub(crate) fn unix_now() -> u64 {
    crate::clock::now_ms() / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000;

    #[test]
    fn known_answer() {
        // HMAC-SHA256("secret", "1700000000.{}"), computed independently
        // (`printf '1700000000.{}' | openssl dgst -sha256 -hmac secret`).
        let v = WebhookVerifier::new("secret");
        assert_eq!(
            v.sign(NOW, b"{}"),
            format!("t={NOW},v1=b8569b78799ff9e3cbff0fc2d63a33a2b57f3282abd07c37ae5e8e7d79a5f163")
        );
    }

    #[test]
    fn malformed_headers_are_refused() {
        let v = WebhookVerifier::new("s");
        let good = v.sign(NOW, b"x");
        let tag = good.split_once(",v1=").map(|(_, t)| t).unwrap_or_default();
        for bad in [
            "",
            "garbage",
            "v1=00",
            &format!("t={NOW}"),
            &format!("t=+{NOW},v1={tag}"),
            &format!("t={NOW},t={NOW},v1={tag}"),
            &format!("t=abc,v1={tag}"),
        ] {
            assert!(
                matches!(
                    v.verify_at(Some(bad), b"x", NOW),
                    Err(SignatureError::Malformed(_))
                ),
                "{bad:?}"
            );
        }
        assert_eq!(
            v.verify_at(Some(&format!("t={NOW},v1=zz")), b"x", NOW),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn any_v1_may_match_and_unknown_entries_are_ignored() {
        let v = WebhookVerifier::new("s");
        let good = v.sign(NOW, b"x");
        let tag = good.split_once(",v1=").map(|(_, t)| t).unwrap_or_default();
        let header = format!("t={NOW}, v0=abc, v1={}, v1={tag}", "0".repeat(64));
        assert_eq!(v.verify_at(Some(&header), b"x", NOW), Ok(()));
    }

    #[test]
    fn tolerance_both_ways() {
        let v = WebhookVerifier::new("s").tolerance(Duration::from_secs(10));
        let h = v.sign(NOW, b"x");
        assert_eq!(v.verify_at(Some(&h), b"x", NOW - 10), Ok(()));
        assert_eq!(v.verify_at(Some(&h), b"x", NOW + 10), Ok(()));
        assert!(matches!(
            v.verify_at(Some(&h), b"x", NOW - 11),
            Err(SignatureError::Stale { age_secs: 11, .. })
        ));
        assert!(matches!(
            v.verify_at(Some(&h), b"x", NOW + 11),
            Err(SignatureError::Stale { .. })
        ));
    }
}
