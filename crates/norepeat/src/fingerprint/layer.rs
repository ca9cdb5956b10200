//! The fingerprint guard as a tower layer: [`FingerprintLayer`], the
//! [`Fingerprint`] service it builds, and its answers.

use super::{Claim, FingerprintGuard, FingerprintGuardError};
use crate::body;
use crate::identity::{Identify, UserHeader};
use crate::middleware::{
    GUARD_UNAVAILABLE, Handle, Middleware, ResponseBody, decided_locally, failed_open, mark,
    reject, shadowed, unauthenticated, would,
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
///
/// # The fingerprint, for the handler
/// An admitted request carries its fingerprint, the [`Digest`](super::Digest) the layer
/// claimed, in its extensions: a handler that writes to a database can
/// commit the fingerprint with its effect (a unique row for the window), so
/// that a repeat the layer let through (its store down, another instance)
/// still finds it, without computing it again.
///
/// ```
/// use axum::{Extension, Router, routing::post};
/// use norepeat::fingerprint::{Digest, FingerprintGuard, FingerprintLayer};
/// use norepeat::store::MemoryStore;
///
/// async fn create(Extension(fp): Extension<Digest>) -> String {
///     // e.g. INSERT INTO windows (fingerprint, until) ... in the order's transaction
///     format!("{:02x}", fp.0[0])
/// }
/// let guard = FingerprintGuard::new(MemoryStore::default());
/// let app: Router = Router::new()
///     .route("/orders", post(create).layer(FingerprintLayer::new(guard)));
/// ```
///
/// # Shadow mode
/// With [`shadow(true)`](Self::shadow) the layer decides every request as
/// above and lets every one through: see [`shadow`](Self::shadow).
#[derive(Clone)]
#[must_use]
pub struct FingerprintLayer<G> {
    guard: FingerprintGuard<G>,
    identity: Arc<dyn Identify>,
    route: Option<Cow<'static, str>>,
    max_body: usize,
    duplicate_detail: Option<Cow<'static, str>>,
    shadow: bool,
}

impl<G> std::fmt::Debug for FingerprintLayer<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FingerprintLayer")
            .field("route", &self.route)
            .field("max_body", &self.max_body)
            .field("shadow", &self.shadow)
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
            shadow: false,
        }
    }

    /// Shadow mode (default off): decide, count and log, never refuse.
    ///
    /// Every request is decided as it would be: the first of its kind
    /// takes the fingerprint's key and holds it per the guard's
    /// [`ReleasePolicy`](super::ReleasePolicy), so a repeat within the
    /// window is seen as one. But a request the layer would refuse reaches
    /// the handler anyway, unguarded (it takes no key and frees none), and
    /// is counted in `norepeat_shadow_total{guard="fingerprint", would}`
    /// and logged at `info` (guard, would, route, the caller's hash):
    ///
    /// | would refuse with | `would` |
    /// |---|---|
    /// | 409 `duplicate_submission` | `duplicate` |
    /// | 401 `unauthenticated` (no caller) | `unauthenticated` |
    /// | 400 `invalid_request` (JSON that does not parse) | `invalid_request` |
    /// | 413 `payload_too_large`, announced by `Content-Length` | `payload_too_large` |
    /// | 503 `guard_unavailable` (the store failed, fail-closed) | `unavailable` |
    ///
    /// A fail-open guard whose store fails lets the request through in
    /// either mode, and counts nothing here. Two answers stay even in shadow
    /// mode, because there is no request left to hand on: a body that grows
    /// past [`max_body`](Self::max_body) while it is read (413) and a body
    /// whose stream fails (400).
    ///
    /// The store holds exactly what it would hold without shadow mode, so
    /// turning shadow off refuses the requests shadow mode counted, no more
    /// (Envoy's rate limit `shadow_mode`: the limits are evaluated and
    /// their counters kept; only the answer is not enforced).
    ///
    /// The decision also goes into the response's extensions, as an entry
    /// of its [`ShadowedBy`](crate::shadow::ShadowedBy), for code outside
    /// the layer to read (a gateway counting by route).
    ///
    /// ```
    /// use axum::{Router, body::Body, routing::post};
    /// use http::{Request, StatusCode};
    /// use norepeat::fingerprint::{FingerprintGuard, FingerprintLayer};
    /// use norepeat::store::MemoryStore;
    /// use tower::ServiceExt;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let guard = FingerprintGuard::new(MemoryStore::default());
    /// let app: Router = Router::new().route(
    ///     "/orders/quick",
    ///     post(|| async { StatusCode::CREATED })
    ///         .layer(FingerprintLayer::new(guard).route("/orders/quick").shadow(true)),
    /// );
    /// let order = || {
    ///     Request::post("/orders/quick")
    ///         .header("x-user-id", "u1")
    ///         .header("content-type", "application/json")
    ///         .body(Body::from(r#"{"sku":"SKU-1"}"#))
    ///         .unwrap()
    /// };
    /// assert_eq!(app.clone().oneshot(order()).await.unwrap().status(), StatusCode::CREATED);
    /// // A duplicate: counted (would="duplicate") and logged, but it passes.
    /// assert_eq!(app.oneshot(order()).await.unwrap().status(), StatusCode::CREATED);
    /// # }
    /// ```
    pub fn shadow(mut self, on: bool) -> Self {
        self.shadow = on;
        self
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

/// What the fingerprint decided about one request.
enum Decided<S: Store + Clone, B> {
    /// Its fingerprint's key is this request's: the handler runs under it.
    Admitted(Claim<S>, Request<B>),
    /// Refused with the problem; the request as it was read, for shadow
    /// mode to hand on.
    Refused(Problem, Request<B>, Option<String>),
    /// Refused, and nothing left to hand on (the body was not kept).
    Broken(Problem),
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
    let (claim, req) = match decide(&s, req).await {
        Decided::Admitted(claim, req) => (claim, req),
        Decided::Refused(p, req, user) if s.shadow => {
            let (parts, body) = req.into_parts();
            let route = (s.route.as_deref()).unwrap_or(crate::request::client_path(&parts));
            let s = shadowed("fingerprint", would(p.code), route, user.as_deref());
            let req = Request::from_parts(parts, body);
            return Ok(mark(inner.call(req).await?.map(Either::Left), s));
        }
        Decided::Refused(p, _, _) | Decided::Broken(p) => return Ok(reject(&p)),
    };
    // Renewal lives in this future. Dropped mid-handler, the claim keeps its
    // key for the rest of the window (see `Claim`).
    let result = claim.run(inner.call(req)).await;
    match result {
        Ok(res) => {
            let (held, local) = (claim.is_held(), claim.is_decided_locally());
            claim.finish(res.status().as_u16() < 400).await;
            let res = res.map(Either::Left);
            Ok(match (held, local) {
                (false, _) => failed_open(res, "fingerprint"),
                (true, true) => decided_locally(res, "fingerprint"),
                (true, false) => res,
            })
        }
        Err(e) => {
            claim.finish(false).await;
            Err(e)
        }
    }
}

/// Reads the body (up to the cap), fingerprints the request and takes its
/// key: the same steps, the same store operations, with shadow mode on or
/// off.
async fn decide<G, ReqBody>(s: &FingerprintLayer<G>, req: Request<ReqBody>) -> Decided<G, ReqBody>
where
    G: Store + Clone,
    ReqBody: Body<Data = Bytes> + From<Bytes>,
    ReqBody::Error: std::error::Error + Send + Sync + 'static,
{
    let (parts, body) = req.into_parts();
    let Some(user) = s.identity.identify(&parts) else {
        let p = unauthenticated(&*s.identity);
        return Decided::Refused(p, Request::from_parts(parts, body), None);
    };
    if s.shadow && crate::body::declares_over(&parts.headers, s.max_body) {
        // Refused before a byte is read: the body is still whole.
        let p = Problem::from(body::BodyError::TooLarge { max: s.max_body });
        return Decided::Refused(p, Request::from_parts(parts, body), Some(user));
    }
    let bytes = match body::read(body, s.max_body, &parts.headers).await {
        Ok(b) => b,
        Err(e) => return Decided::Broken(Problem::from(e)),
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
        Err(e) => {
            let req = Request::from_parts(parts, ReqBody::from(bytes));
            return Decided::Refused(Problem::from(e), req, Some(user));
        }
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
            let req = Request::from_parts(parts, ReqBody::from(bytes));
            return Decided::Refused(p, req, Some(user));
        }
    };
    let mut req = Request::from_parts(parts, ReqBody::from(bytes));
    req.extensions_mut().insert(fp);
    Decided::Admitted(claim, req)
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
