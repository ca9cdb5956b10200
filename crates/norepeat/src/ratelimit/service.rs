//! The tower service of [`RateLimitLayer`](super::RateLimitLayer): extract the keys, ask every quota, answer 429 or pass on.

use super::layer::Config;
use super::limiter::{RateLimiter, check_all};
use crate::problem::Problem;
use crate::store::Store;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use http_body_util::{Either, Full};
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::Service;

/// The response body of a rate-limited service: the inner body, or a
/// rejection.
pub type ResponseBody<B> = Either<B, Full<Bytes>>;

/// A service limited by a [`RateLimitLayer`](super::RateLimitLayer).
pub struct RateLimit<S, G> {
    inner: S,
    cfg: Arc<Config<G>>,
}

impl<S: Clone, G> Clone for RateLimit<S, G> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            cfg: Arc::clone(&self.cfg),
        }
    }
}

impl<S, G> std::fmt::Debug for RateLimit<S, G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit").finish_non_exhaustive()
    }
}

impl<S, G> RateLimit<S, G> {
    pub(crate) fn new(inner: S, cfg: Arc<Config<G>>) -> Self {
        Self { inner, cfg }
    }
}

fn reject<B>(p: &Problem) -> Response<ResponseBody<B>> {
    p.to_response().map(Either::Right)
}

impl<S, G, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, G>
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
        let cfg = Arc::clone(&self.cfg);
        Box::pin(async move {
            // Every key first: a request without one is counted nowhere.
            let (parts, body) = req.into_parts();
            let mut keys = Vec::with_capacity(cfg.rules.len());
            for rule in &cfg.rules {
                match rule.key.extract_key(&parts) {
                    Some(k) => keys.push(k),
                    None => return Ok(reject(&rule.key.missing())),
                }
            }
            let checks: Vec<(&RateLimiter<G>, &str)> = cfg
                .rules
                .iter()
                .zip(&keys)
                .map(|(r, k)| (&r.limiter, k.as_str()))
                .collect();
            let verdict = match check_all(&checks).await {
                Ok(v) => v,
                Err(e) => return Ok(reject(&Problem::from(e))),
            };
            if let Some(p) = verdict.to_problem() {
                tracing::debug!(path = crate::request::client_path(&parts), "rate limited");
                return Ok(reject(&p));
            }
            let mut res = inner
                .call(Request::from_parts(parts, body))
                .await?
                .map(Either::Left);
            if cfg.headers_on_allowed {
                for (k, v) in verdict.headers() {
                    res.headers_mut().append(k, v);
                }
            }
            res.extensions_mut().insert(verdict);
            Ok(res)
        })
    }
}
