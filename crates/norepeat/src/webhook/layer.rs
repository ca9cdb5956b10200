//! The verifier as a tower layer: [`WebhookLayer`] and its service.

use super::WebhookVerifier;
use crate::body;
use crate::problem::Problem;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{Either, Full};
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

/// The largest body [`WebhookLayer`] reads unless told otherwise.
pub const DEFAULT_MAX_BODY: usize = 64 * 1024;

/// A tower layer that lets through only requests signed for a
/// [`WebhookVerifier`]. See the [module](super) docs.
#[derive(Debug, Clone)]
pub struct WebhookLayer {
    verifier: WebhookVerifier,
    max_body: usize,
}

impl WebhookLayer {
    /// Verifies with `verifier`, reading bodies up to [`DEFAULT_MAX_BODY`].
    #[must_use]
    pub fn new(verifier: WebhookVerifier) -> Self {
        Self {
            verifier,
            max_body: DEFAULT_MAX_BODY,
        }
    }

    /// The largest body read (413 `payload_too_large` past it).
    #[must_use]
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }
}

impl<S> tower::Layer<S> for WebhookLayer {
    type Service = Webhook<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Webhook {
            inner,
            cfg: Arc::new(self.clone()),
        }
    }
}

/// A service behind a [`WebhookLayer`].
#[derive(Clone)]
pub struct Webhook<S> {
    inner: S,
    cfg: Arc<WebhookLayer>,
}

impl<S> fmt::Debug for Webhook<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Webhook").finish_non_exhaustive()
    }
}

/// The response body of a [`Webhook`] service: the inner body, or a refusal.
pub type ResponseBody<B> = Either<B, Full<Bytes>>;

impl<S, ReqBody, ResBody> tower::Service<Request<ReqBody>> for Webhook<S>
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
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
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let cfg = Arc::clone(&self.cfg);
        Box::pin(async move {
            let refuse = |p: Problem| -> Result<Response<ResponseBody<ResBody>>, S::Error> {
                Ok(p.to_response().map(Either::Right))
            };
            let (parts, body) = req.into_parts();
            let bytes = match body::read(body, cfg.max_body, &parts.headers).await {
                Ok(b) => b,
                Err(e) => return refuse(Problem::from(e)),
            };
            if let Err(e) = cfg.verifier.verify_headers(&parts.headers, &bytes) {
                tracing::debug!(error = %e, "webhook signature refused");
                return refuse(e.to_problem());
            }
            let req = Request::from_parts(parts, ReqBody::from(bytes));
            Ok(inner.call(req).await?.map(Either::Left))
        })
    }
}
