//! The token guard as a tower layer: [`TokenLayer`] and its service.

use super::TokenGuard;
use crate::identity::{Identify, UserHeader};
use crate::problem::{Code, Problem};
use crate::store::Store;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use http_body_util::{Either, Full};
use std::borrow::Cow;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{Layer, Service};
use tracing::Instrument;

/// The response body of a token-guarded service: the inner body, or a
/// rejection.
pub type ResponseBody<B> = Either<B, Full<Bytes>>;

/// The default `detail` of 400 `missing_token`.
const MISSING_TOKEN: &str =
    "Send a repeat token in the Repeat-Token header or the repeatToken query parameter.";

/// What the layer hands its service.
#[derive(Clone)]
struct Settings<G> {
    guard: TokenGuard<G>,
    identity: Arc<dyn Identify>,
    missing_token: Cow<'static, str>,
}

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
    settings: Settings<G>,
}

impl<G> std::fmt::Debug for TokenLayer<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenLayer")
            .field("missing_token", &self.settings.missing_token)
            .finish_non_exhaustive()
    }
}

impl<G> TokenLayer<G> {
    /// Guards with `guard`, the caller from `X-User-Id`.
    pub fn new(guard: TokenGuard<G>) -> Self {
        Self {
            settings: Settings {
                guard,
                identity: Arc::new(UserHeader::default()),
                missing_token: Cow::Borrowed(MISSING_TOKEN),
            },
        }
    }

    /// Where the caller's id comes from.
    pub fn identity(mut self, identity: impl Identify) -> Self {
        self.settings.identity = Arc::new(identity);
        self
    }

    /// The `detail` of 400 `missing_token`: say where the client gets a
    /// token (default: "Send a repeat token in the Repeat-Token header or
    /// the repeatToken query parameter.").
    pub fn missing_token_detail(mut self, detail: impl Into<Cow<'static, str>>) -> Self {
        self.settings.missing_token = detail.into();
        self
    }
}

impl<S, G: Clone> Layer<S> for TokenLayer<G> {
    type Service = TokenService<S, G>;

    fn layer(&self, inner: S) -> Self::Service {
        TokenService {
            inner,
            settings: Arc::new(self.settings.clone()),
        }
    }
}

/// A service guarded by a [`TokenLayer`].
pub struct TokenService<S, G> {
    inner: S,
    settings: Arc<Settings<G>>,
}

impl<S: Clone, G> Clone for TokenService<S, G> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            settings: Arc::clone(&self.settings),
        }
    }
}

impl<S, G> std::fmt::Debug for TokenService<S, G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenService").finish_non_exhaustive()
    }
}

fn reject<B>(p: Problem) -> Response<ResponseBody<B>> {
    p.to_response().map(Either::Right)
}

impl<S, G, ReqBody, ResBody> Service<Request<ReqBody>> for TokenService<S, G>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    G: Store + Clone,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The clone that was polled ready handles this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let settings = Arc::clone(&self.settings);
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let Some(user) = settings.identity.identify(&parts) else {
                return Ok(reject(
                    Problem::new(Code::Unauthenticated).detail(settings.identity.missing()),
                ));
            };
            let req = Request::from_parts(parts, body);
            let Some(token) = token_of(&req) else {
                return Ok(reject(
                    Problem::new(Code::MissingToken).detail(settings.missing_token.clone()),
                ));
            };
            let decision = settings
                .guard
                .consume(&user, &token)
                .instrument(tracing::debug_span!(
                    "norepeat.decide",
                    mode = "token",
                    user
                ));
            if let Err(e) = decision.await {
                return Ok(reject(Problem::from(e)));
            }
            Ok(inner.call(req).await?.map(Either::Left))
        })
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
