//! The token guard as a tower layer: [`TokenLayer`], the [`Token`] service
//! it builds, and its answers.

use super::{TokenGuard, TokenGuardError};
use crate::identity::{Identify, UserHeader};
use crate::middleware::{
    GUARD_UNAVAILABLE, Handle, Middleware, ResponseBody, reject, unauthenticated,
};
use crate::problem::{Code, Problem};
use crate::store::Store;
use http::{Request, Response};
use http_body_util::Either;
use std::borrow::Cow;
use std::sync::Arc;
use tower::{Layer, Service};
use tracing::Instrument;

/// A service guarded by a [`TokenLayer`].
pub type Token<S, G> = Middleware<TokenLayer<G>, S>;

/// The default `detail` of 400 `missing_token`.
const MISSING_TOKEN: &str =
    "Send a repeat token in the Repeat-Token header or the repeatToken query parameter.";

/// Guards a service with one-time tokens.
///
/// The request must carry a token in header `Repeat-Token` or query
/// parameter `repeatToken` (else 400 `missing_token`); a used, expired,
/// unknown or foreign one gets 409 `duplicate_submission`, and a store
/// failure on a fail-closed guard 503 `guard_unavailable`. It needs a caller
/// (401 `unauthenticated` without one), taken from `X-User-Id` unless you set
/// another [`Identify`]. The body is not read.
///
/// ```
/// use axum::{Router, routing::post};
/// use norepeat::store::MemoryStore;
/// use norepeat::token::{TokenGuard, TokenLayer, TokenSigner};
///
/// let tokens = TokenGuard::new(MemoryStore::default(), TokenSigner::random());
/// let app: Router = Router::new()
///     .route("/orders", post(|| async { "ok" }).layer(TokenLayer::new(tokens)));
/// ```
#[derive(Clone)]
#[must_use]
pub struct TokenLayer<G> {
    guard: TokenGuard<G>,
    identity: Arc<dyn Identify>,
    missing_token: Cow<'static, str>,
}

impl<G> std::fmt::Debug for TokenLayer<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenLayer")
            .field("missing_token", &self.missing_token)
            .finish_non_exhaustive()
    }
}

impl<G> TokenLayer<G> {
    /// Guards with `guard`, the caller from `X-User-Id`.
    pub fn new(guard: TokenGuard<G>) -> Self {
        Self {
            guard,
            identity: Arc::new(UserHeader::default()),
            missing_token: Cow::Borrowed(MISSING_TOKEN),
        }
    }

    /// Where the caller's id comes from.
    pub fn identity(mut self, identity: impl Identify) -> Self {
        self.identity = Arc::new(identity);
        self
    }

    /// The `detail` of 400 `missing_token`: say where the client gets a
    /// token (default: "Send a repeat token in the Repeat-Token header or
    /// the repeatToken query parameter.").
    pub fn missing_token_detail(mut self, detail: impl Into<Cow<'static, str>>) -> Self {
        self.missing_token = detail.into();
        self
    }
}

impl<S, G: Clone> Layer<S> for TokenLayer<G> {
    type Service = Token<S, G>;

    fn layer(&self, inner: S) -> Self::Service {
        Middleware::new(inner, self.clone())
    }
}

impl<S, G, ReqBody, ResBody> Handle<S, ReqBody, ResBody> for TokenLayer<G>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    G: Store + Clone,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Body = ResponseBody<ResBody>;

    async fn handle(
        self: Arc<Self>,
        mut inner: S,
        req: Request<ReqBody>,
    ) -> Result<Response<Self::Body>, S::Error> {
        let (parts, body) = req.into_parts();
        let Some(user) = self.identity.identify(&parts) else {
            return Ok(reject(&unauthenticated(&*self.identity)));
        };
        let req = Request::from_parts(parts, body);
        let Some(token) = token_of(&req) else {
            return Ok(reject(
                &Problem::new(Code::MissingToken).detail(self.missing_token.clone()),
            ));
        };
        let decision = self
            .guard
            .consume(&user, &token)
            .instrument(tracing::debug_span!(
                "norepeat.decide",
                mode = "token",
                user
            ));
        if let Err(e) = decision.await {
            return Ok(reject(&Problem::from(e)));
        }
        Ok(inner.call(req).await?.map(Either::Left))
    }
}

/// The token from `Repeat-Token`, else from `repeatToken` in the query.
/// A header that is not visible ASCII is kept as an (invalid) token so the
/// answer is 409, not "missing".
fn token_of<B>(req: &Request<B>) -> Option<String> {
    if let Some(v) = req.headers().get("repeat-token") {
        return Some(String::from_utf8_lossy(v.as_bytes()).into_owned());
    }
    req.uri().query()?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == "repeatToken").then(|| v.to_owned())
    })
}

impl From<TokenGuardError> for Problem {
    fn from(e: TokenGuardError) -> Self {
        let duplicate =
            |detail: &'static str| Problem::new(Code::DuplicateSubmission).detail(detail);
        match e {
            TokenGuardError::Used => {
                duplicate("This form was already submitted. Reload to get a new token.")
            }
            TokenGuardError::Expired => {
                duplicate("The repeat token expired. Reload to get a new one.")
            }
            TokenGuardError::Invalid => {
                duplicate("The repeat token is unknown or belongs to another user.")
            }
            TokenGuardError::Unavailable(_) => Problem::new(Code::GuardUnavailable)
                .detail(GUARD_UNAVAILABLE)
                .retry_after_secs(1),
        }
    }
}
