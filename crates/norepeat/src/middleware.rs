//! The skeleton of the crate's five tower services (fingerprint, token,
//! idempotency, rate limit, webhook), written once, as tower-http writes
//! its `define_inner_service_accessors!`.
//!
//! Each capability's `layer.rs` keeps its `XLayer` (the builder, and the
//! settings its service reads: the layer *is* the settings) and implements
//! [`Handle`], the one thing that differs: what to do with a request.
//! Everything else is here: [`Middleware`], the service every layer builds
//! (it owns `poll_ready`, the clone-and-replace in `call`, the boxing, and
//! tower-http's `get_ref`/`get_mut`/`into_inner`), the one
//! [`ResponseBody`], the one [`reject`], the answers shared by several
//! layers (a body too large or not JSON, a caller missing, a store down),
//! and shadow mode's one record of what a layer would have refused
//! ([`shadowed`]).
//!
//! Per request this costs what each service cost when it was written out:
//! one `Arc` clone of the layer and one boxed future.

use crate::body::BodyError;
use crate::degrade::{DecidedLocally, FailedOpen};
use crate::identity::Identify;
use crate::json::InvalidJson;
use crate::problem::{Code, Problem};
use crate::shadow::{Shadowed, ShadowedBy};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use http_body_util::{Either, Full};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::Service;

/// The response body of a guarded service: the inner service's body
/// (`Left`), or one the layer wrote (`Right`: a refusal, or for
/// idempotency a stored or replayed answer).
pub type ResponseBody<B> = Either<B, Full<Bytes>>;

/// A refusal as a response of a guarded service.
pub(crate) fn reject<B>(p: &Problem) -> Response<ResponseBody<B>> {
    p.to_response().map(Either::Right)
}

/// 401 `unauthenticated`, saying what `identity` wanted.
pub(crate) fn unauthenticated(identity: &dyn Identify) -> Problem {
    Problem::new(Code::Unauthenticated).detail(identity.missing())
}

/// The `detail` of 503 `guard_unavailable` from a guard whose store failed.
pub(crate) const GUARD_UNAVAILABLE: &str =
    "The duplicate guard cannot decide right now; retry shortly.";

/// Shadow mode (`.shadow(true)` on the fingerprint, token, Idempotency-Key
/// and rate-limit layers): the layer took its decision, would have answered
/// `p`, and lets the request through instead. Counted in
/// `norepeat_shadow_total{guard, would}` and logged at `info` with the
/// guard, what it would have done, the route and the caller, hashed
/// ([`user_hash`]). Each layer calls this, then hands the request on
/// unguarded, so the metric and the line are the same for all four. The
/// [`Shadowed`] it returns goes into the response's [`ShadowedBy`]
/// ([`mark`]).
pub(crate) fn shadowed(
    guard: &'static str,
    would: &'static str,
    route: &str,
    user: Option<&str>,
) -> Shadowed {
    metrics::counter!("norepeat_shadow_total", "guard" => guard, "would" => would).increment(1);
    let user = user.map(user_hash);
    tracing::info!(
        guard,
        would,
        route,
        user = user.as_deref(),
        "shadow mode: would refuse; let through"
    );
    Shadowed { guard, would }
}

/// Adds `guard` to the [`FailedOpen`] in `res`'s extensions: the layer let
/// the request through undecided because its store failed and its policy
/// fails open. Each layer calls this where it does, so a gateway or a test
/// reads it as a value, as it reads [`ShadowedBy`].
pub(crate) fn failed_open<B>(mut res: Response<B>, guard: &'static str) -> Response<B> {
    FailedOpen::add(res.extensions_mut(), guard);
    res
}

/// Adds `guard` to the [`DecidedLocally`] in `res`'s extensions: the
/// layer's store failed and its local memory admitted the request.
pub(crate) fn decided_locally<B>(mut res: Response<B>, guard: &'static str) -> Response<B> {
    DecidedLocally::add(res.extensions_mut(), guard);
    res
}

/// Adds `s` to the [`ShadowedBy`] in `res`'s extensions.
pub(crate) fn mark<B>(mut res: Response<B>, s: Shadowed) -> Response<B> {
    ShadowedBy::add(res.extensions_mut(), s);
    res
}

/// The `would` label of a refusal answered `code`: the decisions by their
/// short names (`duplicate`, `in_progress`, `mismatch`, `rate_limited`,
/// `unavailable` for a fail-closed store that failed), every other answer by
/// its code (`unauthenticated`, `missing_token`, `missing_idempotency_key`,
/// `invalid_idempotency_key`, `invalid_request`, `payload_too_large`). A
/// replay, which is no refusal, is `replay`.
pub(crate) fn would(code: Code) -> &'static str {
    match code {
        // An expired token is a repeat the page should not have sent (it
        // kept a token past its life): counted with the other refused
        // tokens.
        Code::DuplicateSubmission | Code::TokenExpired => "duplicate",
        Code::IdempotencyKeyInUse => "in_progress",
        Code::IdempotencyOutcomeUnknown => "outcome_unknown",
        Code::IdempotencyKeyMismatch => "mismatch",
        Code::GuardUnavailable => "unavailable",
        other => other.as_str(),
    }
}

/// A caller's id as a shadow line shows it: the first 8 bytes of its BLAKE3
/// hash, in hex. The same caller gives the same value on every line and
/// every instance, so lines can be grouped by caller; the id itself is not
/// written to an `info` log. Not a secret: anyone who knows an id can hash
/// it to find its lines.
pub(crate) fn user_hash(user: &str) -> String {
    hex::encode(&blake3::hash(user.as_bytes()).as_bytes()[..8])
}

/// What a layer does with one request: the one part of a service that is
/// its own. `self` is the layer (its settings), shared by every clone of
/// the service; `inner` is the clone of the inner service that was polled
/// ready.
pub trait Handle<S, ReqBody, ResBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    /// The body of the responses: usually [`ResponseBody<ResBody>`].
    type Body;

    /// Answers `req`, calling `inner` or not.
    fn handle(
        self: Arc<Self>,
        inner: S,
        req: Request<ReqBody>,
    ) -> impl Future<Output = Result<Response<Self::Body>, S::Error>> + Send + 'static;
}

/// The service a layer `L` builds around `S`: the crate's five services
/// are this type (`fingerprint::Fingerprint<S, G>` is
/// `Middleware<FingerprintLayer<G>, S>`, and so on).
pub struct Middleware<L, S> {
    inner: S,
    layer: Arc<L>,
}

impl<L, S> Middleware<L, S> {
    /// `inner`, guarded by `layer`.
    pub(crate) fn new(inner: S, layer: L) -> Self {
        Self {
            inner,
            layer: Arc::new(layer),
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming this one.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<L, S: Clone> Clone for Middleware<L, S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: Arc::clone(&self.layer),
        }
    }
}

impl<L: fmt::Debug, S> fmt::Debug for Middleware<L, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Middleware")
            .field("layer", &self.layer)
            .finish_non_exhaustive()
    }
}

impl<L, S, ReqBody, ResBody> Service<Request<ReqBody>> for Middleware<L, S>
where
    L: Handle<S, ReqBody, ResBody>,
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
{
    type Response = Response<L::Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The clone that was polled ready handles this request.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(Arc::clone(&self.layer).handle(inner, req))
    }
}

impl From<BodyError> for Problem {
    fn from(e: BodyError) -> Self {
        match e {
            BodyError::TooLarge { max } => Problem::new(Code::PayloadTooLarge)
                .detail(format!("The request body is larger than {}.", size(max))),
            BodyError::Unreadable(why) => Problem::new(Code::InvalidRequest)
                .detail(format!("The request body could not be read: {why}")),
        }
    }
}

impl From<InvalidJson> for Problem {
    fn from(e: InvalidJson) -> Self {
        Problem::new(Code::InvalidRequest).detail(e.to_string())
    }
}

/// A size as people write it: `64 KiB`, `1 MiB`, else `1000 bytes`.
fn size(bytes: usize) -> String {
    match bytes {
        0 => "0 bytes".to_owned(),
        n if n % (1024 * 1024) == 0 => format!("{} MiB", n / (1024 * 1024)),
        n if n % 1024 == 0 => format!("{} KiB", n / 1024),
        n => format!("{n} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shadow_labels_name_the_answer() {
        assert_eq!(would(Code::DuplicateSubmission), "duplicate");
        assert_eq!(would(Code::IdempotencyKeyInUse), "in_progress");
        assert_eq!(would(Code::IdempotencyKeyMismatch), "mismatch");
        assert_eq!(would(Code::RateLimited), "rate_limited");
        assert_eq!(would(Code::GuardUnavailable), "unavailable");
        assert_eq!(would(Code::MissingToken), "missing_token");
        assert_eq!(would(Code::Unauthenticated), "unauthenticated");
    }

    #[test]
    fn shadow_lines_hash_the_caller() {
        assert_eq!(user_hash("u1"), user_hash("u1"));
        assert_ne!(user_hash("u1"), user_hash("u2"));
        assert_eq!(user_hash("u1").len(), 16);
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(size(64 * 1024), "64 KiB");
        assert_eq!(size(1024 * 1024), "1 MiB");
        assert_eq!(size(1000), "1000 bytes");
    }
}
