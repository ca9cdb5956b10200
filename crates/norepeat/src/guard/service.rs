//! The tower service.

use super::layer::{Config, Kind};
use super::{FingerprintGuard, TokenGuard};
use crate::body::{self, ReadError};
use crate::problem::{Code, Problem};
use crate::store::Store;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{Either, Full};
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::Service;
use tracing::Instrument;

/// The response body of a guarded service: the inner body, or a rejection.
pub type ResponseBody<B> = Either<B, Full<Bytes>>;

/// A service guarded by a [`NoRepeatLayer`](super::NoRepeatLayer).
pub struct NoRepeat<S, G> {
    inner: S,
    cfg: Arc<Config<G>>,
}

impl<S: Clone, G> Clone for NoRepeat<S, G> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            cfg: Arc::clone(&self.cfg),
        }
    }
}

impl<S, G> std::fmt::Debug for NoRepeat<S, G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NoRepeat").finish_non_exhaustive()
    }
}

impl<S, G> NoRepeat<S, G> {
    pub(crate) fn new(inner: S, cfg: Arc<Config<G>>) -> Self {
        Self { inner, cfg }
    }
}

fn reject<B>(p: &Problem) -> Response<ResponseBody<B>> {
    p.to_response().map(Either::Right)
}

impl<S, G, ReqBody, ResBody> Service<Request<ReqBody>> for NoRepeat<S, G>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    G: Store + Clone,
    ReqBody: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqBody::Error: std::error::Error + Send + Sync + 'static,
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
        let inner = std::mem::replace(&mut self.inner, clone);
        let cfg = Arc::clone(&self.cfg);
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let Some(user) = cfg.identity.identify(&parts) else {
                return Ok(reject(&Problem::new(Code::Unauthenticated).detail(
                    "A valid X-User-Id header (1 to 64 visible ASCII characters) is required.",
                )));
            };
            match &cfg.kind {
                Kind::Token(g) => {
                    let req = Request::from_parts(parts, body);
                    call_with_token(g, &user, inner, req).await
                }
                Kind::Fingerprint(g) => {
                    call_with_fingerprint(g, &cfg, &user, inner, parts, body).await
                }
            }
        })
    }
}

async fn call_with_token<S, G, ReqBody, ResBody>(
    guard: &TokenGuard<G>,
    user: &str,
    mut inner: S,
    req: Request<ReqBody>,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    G: Store + Clone,
{
    let Some(token) = token_of(&req) else {
        return Ok(reject(&Problem::new(Code::MissingToken).detail(
            "Send the token from GET /repeat/token in the Repeat-Token header or the repeatToken query parameter.",
        )));
    };
    let decision = guard.consume(user, &token).instrument(tracing::debug_span!(
        "norepeat.decide",
        mode = "token",
        user
    ));
    if let Err(p) = decision.await {
        return Ok(reject(&p));
    }
    Ok(inner.call(req).await?.map(Either::Left))
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

async fn call_with_fingerprint<S, G, ReqBody, ResBody>(
    guard: &FingerprintGuard<G>,
    cfg: &Config<G>,
    user: &str,
    mut inner: S,
    parts: http::request::Parts,
    body: ReqBody,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    G: Store + Clone,
    ReqBody: Body<Data = Bytes> + From<Bytes>,
    ReqBody::Error: std::error::Error + Send + Sync + 'static,
{
    let bytes = match body::read(body, cfg.max_body, &parts.headers).await {
        Ok(b) => b,
        Err(ReadError::TooLarge) => {
            return Ok(reject(&Problem::new(Code::PayloadTooLarge).detail(
                format!("The request body is larger than {} bytes.", cfg.max_body),
            )));
        }
        Err(ReadError::Broken(e)) => {
            return Ok(reject(
                &Problem::new(Code::InvalidRequest)
                    .detail(format!("The request body could not be read: {e}")),
            ));
        }
    };
    // The concrete path goes into the fingerprint (`/orders/1/pay` and
    // `/orders/2/pay` are different requests); the template is a label.
    let path = parts.uri.path();
    let route = cfg.route.as_deref().unwrap_or(path);
    let fp = guard
        .fingerprinter
        .fingerprint_http(user, &parts, path, &bytes);
    let fp = match fp {
        Ok(fp) => fp,
        Err(e) => {
            return Ok(reject(
                &Problem::new(Code::InvalidRequest).detail(e.to_string()),
            ));
        }
    };
    let decision = guard.acquire(&fp).instrument(tracing::debug_span!(
        "norepeat.decide",
        mode = "fingerprint",
        user,
        route
    ));
    let lease = match decision.await {
        Ok(l) => l,
        Err(p) => {
            tracing::debug!(user, route, "fingerprint duplicate rejected");
            return Ok(reject(&p));
        }
    };
    let req = Request::from_parts(parts, ReqBody::from(bytes));
    // Renewal lives in this future. Dropped mid-handler, the lease keeps its
    // key for the rest of the window (see `Lease`).
    let result = lease.run(inner.call(req)).await;
    match result {
        Ok(res) => {
            lease.finish(res.status().as_u16() < 400).await;
            Ok(res.map(Either::Left))
        }
        Err(e) => {
            lease.finish(false).await;
            Err(e)
        }
    }
}
