//! The tower layer.

use super::service::NoRepeat;
use super::{FingerprintGuard, TokenGuard};
use crate::identity::{Identify, UserHeader};
use std::borrow::Cow;
use std::sync::Arc;
use tower::Layer;

#[derive(Clone)]
pub(crate) enum Kind<G> {
    Token(TokenGuard<G>),
    Fingerprint(FingerprintGuard<G>),
}

#[derive(Clone)]
pub(crate) struct Config<G> {
    pub(crate) kind: Kind<G>,
    pub(crate) identity: Arc<dyn Identify>,
    pub(crate) route: Option<Cow<'static, str>>,
    pub(crate) max_body: usize,
}

/// Guards a service with a token or a fingerprint guard.
///
/// - Token mode: the request must carry a token in header `Repeat-Token` or
///   query parameter `repeatToken` (else 400 `missing_token`); a used,
///   expired, unknown or foreign one gets 409 `duplicate_submission`.
/// - Fingerprint mode: the body is read once (up to 64 KiB by default, else
///   413 `payload_too_large`), fingerprinted, and handed on unchanged. A
///   repeat within the window gets 409 `duplicate_submission` with
///   `Retry-After`. A JSON body that does not parse gets 400
///   `invalid_request`.
///
/// Both need a caller (401 `unauthenticated` without one), taken from
/// `X-User-Id` unless you set another [`Identify`].
///
/// ```
/// use axum::{Router, routing::{get, post}};
/// use norepeat::guard::{NoRepeatLayer, TokenGuard};
/// use norepeat::store::MemoryStore;
/// use norepeat::token::TokenSigner;
///
/// let tokens = TokenGuard::new(MemoryStore::default(), TokenSigner::random());
/// let app: Router = Router::new()
///     .route("/orders", post(|| async { "ok" }).layer(NoRepeatLayer::token(tokens)));
/// ```
#[derive(Clone)]
#[must_use]
pub struct NoRepeatLayer<G> {
    cfg: Config<G>,
}

impl<G> std::fmt::Debug for NoRepeatLayer<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NoRepeatLayer")
            .field("route", &self.cfg.route)
            .field("max_body", &self.cfg.max_body)
            .finish_non_exhaustive()
    }
}

impl<G> NoRepeatLayer<G> {
    fn with(kind: Kind<G>) -> Self {
        Self {
            cfg: Config {
                kind,
                identity: Arc::new(UserHeader::default()),
                route: None,
                max_body: 64 * 1024,
            },
        }
    }

    /// One-time token mode.
    pub fn token(guard: TokenGuard<G>) -> Self {
        Self::with(Kind::Token(guard))
    }

    /// Fingerprint mode.
    pub fn fingerprint(guard: FingerprintGuard<G>) -> Self {
        Self::with(Kind::Fingerprint(guard))
    }

    /// The route template (`/orders/{id}/pay`), a label for logs and traces
    /// only. The fingerprint always takes the concrete request path, so
    /// `/orders/1/pay` and `/orders/2/pay` never meet.
    pub fn route(mut self, template: impl Into<Cow<'static, str>>) -> Self {
        self.cfg.route = Some(template.into());
        self
    }

    /// Where the caller's id comes from.
    pub fn identity(mut self, identity: impl Identify) -> Self {
        self.cfg.identity = Arc::new(identity);
        self
    }

    /// The largest body the fingerprint mode reads (default 64 KiB).
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.cfg.max_body = bytes;
        self
    }
}

impl<S, G: Clone> Layer<S> for NoRepeatLayer<G> {
    type Service = NoRepeat<S, G>;

    fn layer(&self, inner: S) -> Self::Service {
        NoRepeat::new(inner, Arc::new(self.cfg.clone()))
    }
}
