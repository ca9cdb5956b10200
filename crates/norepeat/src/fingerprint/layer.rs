//! The fingerprint guard as a tower layer: [`FingerprintLayer`], the
//! [`Fingerprint`] service it builds, and its answers.

use super::{FingerprintGuard, FingerprintGuardError};
use crate::body;
use crate::identity::{Identify, UserHeader};
use crate::middleware::{
    GUARD_UNAVAILABLE, Handle, Middleware, ResponseBody, reject, unauthenticated,
};
use crate::problem::{Code, Problem};
use crate::store::Store;
use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::Either;
use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use tower::{Layer, Service};
use tracing::Instrument;

/// A service guarded by a [`FingerprintLayer`].
pub type Fingerprint<S, G> = Middleware<FingerprintLayer<G>, S>;

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
    guard: FingerprintGuard<G>,
    identity: Arc<dyn Identify>,
    route: Option<Cow<'static, str>>,
    max_body: usize,
    duplicate_detail: Option<Cow<'static, str>>,
}

impl<G> std::fmt::Debug for FingerprintLayer<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FingerprintLayer")
            .field("route", &self.route)
            .field("max_body", &self.max_body)
            .finish_non_exhaustive()
    }
}

impl<G> FingerprintLayer<G> {
    /// Guards with `guard`: the caller from `X-User-Id`, bodies up to 64 KiB.
    pub fn new(guard: FingerprintGuard<G>) -> Self {
        Self {
            guard,
            identity: Arc::new(UserHeader::default()),
            route: None,
            max_body: 64 * 1024,
            duplicate_detail: None,
        }
    }

    /// The route template (`/orders/{id}/pay`), a label for logs and traces
    /// only. The fingerprint always takes the concrete path the client sent
    /// (also inside `Router::nest`, see [`crate::request`]), so
    /// `/orders/1/pay` and `/orders/2/pay` never meet.
    pub fn route(mut self, template: impl Into<Cow<'static, str>>) -> Self {
        self.route = Some(template.into());
        self
    }

    /// Where the caller's id comes from.
    pub fn identity(mut self, identity: impl Identify) -> Self {
        self.identity = Arc::new(identity);
        self
    }

    /// The largest body read (default 64 KiB).
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// The `detail` of the 409 `duplicate_submission` answer (default:
    /// "This request was already submitted; wait before sending it
    /// again.").
    pub fn duplicate_detail(mut self, detail: impl Into<Cow<'static, str>>) -> Self {
        self.duplicate_detail = Some(detail.into());
        self
    }
}

impl<S, G: Clone> Layer<S> for FingerprintLayer<G> {
    type Service = Fingerprint<S, G>;

    fn layer(&self, inner: S) -> Self::Service {
        Middleware::new(inner, self.clone())
    }
}

impl<S, G, ReqBody, ResBody> Handle<S, ReqBody, ResBody> for FingerprintLayer<G>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    G: Store + Clone,
    ReqBody: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqBody::Error: std::error::Error + Send + Sync + 'static,
    ResBody: Send + 'static,
{
    type Body = ResponseBody<ResBody>;

    fn handle(
        self: Arc<Self>,
        inner: S,
        req: Request<ReqBody>,
    ) -> impl Future<Output = Result<Response<Self::Body>, S::Error>> + Send + 'static {
        guarded(self, inner, req)
    }
}

async fn guarded<S, G, ReqBody, ResBody>(
    s: Arc<FingerprintLayer<G>>,
    mut inner: S,
    req: Request<ReqBody>,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    G: Store + Clone,
    ReqBody: Body<Data = Bytes> + From<Bytes>,
    ReqBody::Error: std::error::Error + Send + Sync + 'static,
{
    let (parts, body) = req.into_parts();
    let Some(user) = s.identity.identify(&parts) else {
        return Ok(reject(&unauthenticated(&*s.identity)));
    };
    let bytes = match body::read(body, s.max_body, &parts.headers).await {
        Ok(b) => b,
        Err(e) => return Ok(reject(&Problem::from(e))),
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
        Err(e) => return Ok(reject(&Problem::from(e))),
    };
    let decision = s.guard.acquire(&fp).instrument(tracing::debug_span!(
        "norepeat.decide",
        mode = "fingerprint",
        user,
        route
    ));
    let claim = match decision.await {
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
            return Ok(reject(&p));
        }
    };
    let req = Request::from_parts(parts, ReqBody::from(bytes));
    // Renewal lives in this future. Dropped mid-handler, the claim keeps its
    // key for the rest of the window (see `Claim`).
    let result = claim.run(inner.call(req)).await;
    match result {
        Ok(res) => {
            claim.finish(res.status().as_u16() < 400).await;
            Ok(res.map(Either::Left))
        }
        Err(e) => {
            claim.finish(false).await;
            Err(e)
        }
    }
}

impl From<FingerprintGuardError> for Problem {
    fn from(e: FingerprintGuardError) -> Self {
        match e {
            FingerprintGuardError::Duplicate { retry_after } => {
                Problem::new(Code::DuplicateSubmission)
                    .detail("This request was already submitted; wait before sending it again.")
                    .retry_after(retry_after)
            }
            FingerprintGuardError::Unavailable(_) => Problem::new(Code::GuardUnavailable)
                .detail(GUARD_UNAVAILABLE)
                .retry_after_secs(1),
        }
    }
}
