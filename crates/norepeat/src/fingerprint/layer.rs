//! The fingerprint guard as a tower layer: [`FingerprintLayer`] and its
//! service.

use super::{FingerprintGuard, FingerprintGuardError};
use crate::body;
use crate::identity::{Identify, UserHeader};
use crate::problem::{Code, Problem};
use crate::store::Store;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{Either, Full};
use std::borrow::Cow;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{Layer, Service};
use tracing::Instrument;

/// The response body of a fingerprint-guarded service: the inner body, or a
/// rejection.
pub type ResponseBody<B> = Either<B, Full<Bytes>>;

/// What the layer hands its service.
#[derive(Clone)]
struct Settings<G> {
    guard: FingerprintGuard<G>,
    identity: Arc<dyn Identify>,
    route: Option<Cow<'static, str>>,
    max_body: usize,
    duplicate_detail: Option<Cow<'static, str>>,
}

/// Guards a service with request fingerprints.
///
/// The body is read once (up to 64 KiB by default, else 413
/// `payload_too_large`), fingerprinted with the caller, method, concrete
/// path and query, and handed on unchanged. A repeat within the window gets
/// 409 `duplicate_submission` with `Retry-After`; a store failure on a
/// fail-closed guard 503 `guard_unavailable`. A body declared JSON that does
/// not parse gets 400 `invalid_request` (the rule is in [`crate::body`]).
/// It needs a caller (401 `unauthenticated` without one), taken from
/// `X-User-Id` unless you set another [`Identify`].
///
/// ```
/// use axum::{Router, routing::post};
/// use norepeat::fingerprint::{FingerprintGuard, FingerprintLayer};
/// use norepeat::store::MemoryStore;
/// use std::time::Duration;
///
/// let guard = FingerprintGuard::new(MemoryStore::default()).window(Duration::from_secs(3));
/// let app: Router = Router::new().route(
///     "/orders/quick",
///     post(|| async { "created" }).layer(FingerprintLayer::new(guard).route("/orders/quick")),
/// );
/// ```
#[derive(Clone)]
#[must_use]
pub struct FingerprintLayer<G> {
    settings: Settings<G>,
}

impl<G> std::fmt::Debug for FingerprintLayer<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FingerprintLayer")
            .field("route", &self.settings.route)
            .field("max_body", &self.settings.max_body)
            .finish_non_exhaustive()
    }
}

impl<G> FingerprintLayer<G> {
    /// Guards with `guard`: the caller from `X-User-Id`, bodies up to 64 KiB.
    pub fn new(guard: FingerprintGuard<G>) -> Self {
        Self {
            settings: Settings {
                guard,
                identity: Arc::new(UserHeader::default()),
                route: None,
                max_body: 64 * 1024,
                duplicate_detail: None,
            },
        }
    }

    /// The route template (`/orders/{id}/pay`), a label for logs and traces
    /// only. The fingerprint always takes the concrete path the client sent
    /// (also inside `Router::nest`, see [`crate::request`]), so
    /// `/orders/1/pay` and `/orders/2/pay` never meet.
    pub fn route(mut self, template: impl Into<Cow<'static, str>>) -> Self {
        self.settings.route = Some(template.into());
        self
    }

    /// Where the caller's id comes from.
    pub fn identity(mut self, identity: impl Identify) -> Self {
        self.settings.identity = Arc::new(identity);
        self
    }

    /// The largest body read (default 64 KiB).
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.settings.max_body = bytes;
        self
    }

    /// The `detail` of the 409 `duplicate_submission` answer (default:
    /// "This request was already submitted; wait before sending it
    /// again.").
    pub fn duplicate_detail(mut self, detail: impl Into<Cow<'static, str>>) -> Self {
        self.settings.duplicate_detail = Some(detail.into());
        self
    }
}

impl<S, G: Clone> Layer<S> for FingerprintLayer<G> {
    type Service = FingerprintService<S, G>;

    fn layer(&self, inner: S) -> Self::Service {
        FingerprintService {
            inner,
            settings: Arc::new(self.settings.clone()),
        }
    }
}

/// A service guarded by a [`FingerprintLayer`].
pub struct FingerprintService<S, G> {
    inner: S,
    settings: Arc<Settings<G>>,
}

impl<S: Clone, G> Clone for FingerprintService<S, G> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            settings: Arc::clone(&self.settings),
        }
    }
}

impl<S, G> std::fmt::Debug for FingerprintService<S, G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FingerprintService").finish_non_exhaustive()
    }
}

fn reject<B>(p: Problem) -> Response<ResponseBody<B>> {
    p.to_response().map(Either::Right)
}

impl<S, G, ReqBody, ResBody> Service<Request<ReqBody>> for FingerprintService<S, G>
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
        let settings = Arc::clone(&self.settings);
        Box::pin(guarded(settings, inner, req))
    }
}

async fn guarded<S, G, ReqBody, ResBody>(
    settings: Arc<Settings<G>>,
    mut inner: S,
    req: Request<ReqBody>,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    G: Store + Clone,
    ReqBody: Body<Data = Bytes> + From<Bytes>,
    ReqBody::Error: std::error::Error + Send + Sync + 'static,
{
    let s = &*settings;
    let (parts, body) = req.into_parts();
    let Some(user) = s.identity.identify(&parts) else {
        return Ok(reject(
            Problem::new(Code::Unauthenticated).detail(s.identity.missing()),
        ));
    };
    let bytes = match body::read(body, s.max_body, &parts.headers).await {
        Ok(b) => b,
        Err(e) => return Ok(reject(Problem::from(e))),
    };
    // The concrete path goes into the fingerprint (`/orders/1/pay` and
    // `/orders/2/pay` are different requests), as the client sent it (a
    // nesting router has shortened `parts.uri`); the template is a label.
    let path = crate::request::client_path(&parts);
    let route = s.route.as_deref().unwrap_or(path);
    let fp = match s
        .guard
        .fingerprinter
        .fingerprint_http(&user, &parts, path, &bytes)
    {
        Ok(fp) => fp,
        Err(e) => return Ok(reject(Problem::from(e))),
    };
    let decision = s.guard.acquire(&fp).instrument(tracing::debug_span!(
        "norepeat.decide",
        mode = "fingerprint",
        user,
        route
    ));
    let lease = match decision.await {
        Ok(l) => l,
        Err(e) => {
            let duplicate = matches!(e, FingerprintGuardError::Duplicate { .. });
            let mut p = Problem::from(e);
            if duplicate {
                tracing::debug!(user, route, "fingerprint duplicate rejected");
                if let Some(d) = &s.duplicate_detail {
                    p = p.detail(d.clone());
                }
            }
            return Ok(reject(p));
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
