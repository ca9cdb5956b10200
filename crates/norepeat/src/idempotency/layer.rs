//! [`IdempotencyLayer`]: the tower layer, its settings, and which responses are stored ([`StorePolicy`]).

use super::detached::DetachedTasks;
use super::service::Idempotency;
use crate::degrade::FailurePolicy;
use crate::fingerprint::Fingerprinter;
use crate::identity::{Identify, UserHeader};
use crate::keys::KeyBuilder;
use crate::lease::Renewer;
use http::{HeaderName, StatusCode, header};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tower::Layer;

/// Which finished responses are stored and replayed. A response that is
/// not stored releases the key, so a retry runs the handler again. A
/// stored response whose body cannot be kept (over the cap, an event
/// stream, trailers, a body that breaks) is stored without it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StorePolicy {
    /// 2xx, and the 4xx that describe the request itself (400, 422, 410,
    /// ...). Not 401, 403, 404, 408, 409, 413 or 429: nothing happened, and
    /// the answer describes the caller or a moment (a login, a missing
    /// resource, a lock, a size limit, a rate), not an effect; it may well
    /// change on retry, and a client sending fresh keys must not pile up a
    /// day's record for each (a 404 per unknown id at 5k requests/s is
    /// gigabytes an hour). No 1xx, 3xx or 5xx.
    #[default]
    Default,
    /// Every response once the handler has started, 5xx included: Stripe's
    /// behaviour. Only a handler *error* (no response at all) releases.
    All,
    /// 2xx only.
    SuccessOnly,
}

impl StorePolicy {
    /// Whether a response with `status` is stored.
    #[must_use]
    pub fn stores(self, status: StatusCode) -> bool {
        match self {
            StorePolicy::All => true,
            StorePolicy::SuccessOnly => status.is_success(),
            StorePolicy::Default => {
                status.is_success()
                    || (status.is_client_error()
                        && !matches!(status.as_u16(), 401 | 403 | 404 | 408 | 409 | 413 | 429))
            }
        }
    }
}

/// The response headers replayed by default (besides the status and body).
pub const DEFAULT_REPLAYED_HEADERS: [HeaderName; 8] = [
    header::CONTENT_TYPE,
    header::CONTENT_ENCODING,
    header::CONTENT_LANGUAGE,
    header::CONTENT_LOCATION,
    header::LOCATION,
    header::ETAG,
    header::LAST_MODIFIED,
    header::LINK,
];

/// Headers never stored, whatever the allow-list says: cookies (a replay
/// must not hand out a session) and hop-by-hop or framing headers (they
/// describe one connection, and the replayed body is framed anew).
pub(crate) fn never_stored(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "set-cookie"
            | "set-cookie2"
            | "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "content-length"
            | "idempotent-replayed"
            | "idempotent-body"
    )
}

#[derive(Clone)]
pub(crate) struct Config<G> {
    pub(crate) store: G,
    pub(crate) keys: KeyBuilder,
    pub(crate) fingerprinter: Fingerprinter,
    pub(crate) identity: Arc<dyn Identify>,
    pub(crate) route: Option<Cow<'static, str>>,
    pub(crate) required: bool,
    pub(crate) retention: Duration,
    pub(crate) lease: Duration,
    pub(crate) renew: bool,
    pub(crate) max_body: usize,
    pub(crate) max_request_body: usize,
    pub(crate) policy: StorePolicy,
    pub(crate) wait: Option<Duration>,
    pub(crate) replayed_headers: Arc<[HeaderName]>,
    pub(crate) failure: FailurePolicy,
    /// Renews the claims of handlers that run long, from one task.
    pub(crate) renewer: Renewer<G>,
    /// The detached handlers, for a server to wait for.
    pub(crate) detached: DetachedTasks,
    /// One permit per detached handler that may run at once.
    pub(crate) slots: Arc<Semaphore>,
}

/// How many detached handlers a layer runs at once by default.
pub const DEFAULT_MAX_DETACHED: usize = 1024;

/// Makes a route idempotent under an `Idempotency-Key`: the first request
/// runs, its response is stored, and a repeat gets that response again,
/// byte for byte, with `Idempotent-Replayed: true`.
///
/// Defaults: key required, 24 h retention, 10 s lease renewed while the
/// handler runs, responses up to 1 MiB stored, request bodies up to 64 KiB,
/// [`StorePolicy::Default`], no waiting (409 at once), the
/// [`DEFAULT_REPLAYED_HEADERS`], and **fail-closed**: with the store down
/// the route answers 503 `guard_unavailable` rather than run unprotected.
/// See the [module docs](super) for every answer.
///
/// The handler runs in a task of its own (`tokio::spawn`) once the key is
/// claimed, so the inner service's future and response must be `Send +
/// 'static` (an axum route's are): a client that gives up does not stop a
/// request that started, and its response is stored for the retry. These
/// tasks are bounded ([`max_detached`](Self::max_detached)) and tracked:
/// wait for them at shutdown through [`detached_tasks`](Self::detached_tasks).
///
/// ```
/// use axum::{Router, body::Body, routing::post};
/// use http::{Request, StatusCode};
/// use norepeat::idempotency::IdempotencyLayer;
/// use norepeat::store::MemoryStore;
/// use std::time::Duration;
/// use tower::ServiceExt;
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let layer = IdempotencyLayer::new(MemoryStore::default())
///     .retention(Duration::from_secs(24 * 3600))
///     .wait_for_result(Some(Duration::from_secs(2)))
///     .route("/payments");
/// let app: Router = Router::new().route(
///     "/payments",
///     post(|| async { (StatusCode::CREATED, "{\"paymentId\":\"p1\"}") }).layer(layer),
/// );
/// let pay = || {
///     Request::post("/payments")
///         .header("x-user-id", "u1")
///         .header("idempotency-key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
///         .header("content-type", "application/json")
///         .body(Body::from(r#"{"orderId":"o1","amount":1999}"#))
///         .unwrap()
/// };
/// let first = app.clone().oneshot(pay()).await.unwrap();
/// assert_eq!(first.status(), StatusCode::CREATED);
/// let again = app.oneshot(pay()).await.unwrap();
/// assert_eq!(again.status(), StatusCode::CREATED);
/// assert_eq!(again.headers()["idempotent-replayed"], "true");
/// # }
/// ```
#[derive(Clone)]
#[must_use]
pub struct IdempotencyLayer<G> {
    cfg: Config<G>,
}

impl<G> std::fmt::Debug for IdempotencyLayer<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("route", &self.cfg.route)
            .field("required", &self.cfg.required)
            .field("retention", &self.cfg.retention)
            .field("lease", &self.cfg.lease)
            .field("policy", &self.cfg.policy)
            .field("wait", &self.cfg.wait)
            .field("failure", &self.cfg.failure)
            .finish_non_exhaustive()
    }
}

impl<G: Clone> IdempotencyLayer<G> {
    /// A layer keeping its records in `store`, with the defaults above.
    pub fn new(store: G) -> Self {
        Self {
            cfg: Config {
                renewer: Renewer::new(store.clone()),
                store,
                keys: KeyBuilder::default(),
                fingerprinter: Fingerprinter::default(),
                identity: Arc::new(UserHeader::default()),
                route: None,
                required: true,
                retention: Duration::from_secs(24 * 3600),
                lease: Duration::from_secs(10),
                renew: true,
                max_body: 1024 * 1024,
                max_request_body: 64 * 1024,
                policy: StorePolicy::Default,
                wait: None,
                replayed_headers: Arc::from(DEFAULT_REPLAYED_HEADERS),
                failure: FailurePolicy::FailClosed,
                detached: DetachedTasks::new(),
                slots: Arc::new(Semaphore::new(DEFAULT_MAX_DETACHED)),
            },
        }
    }

    /// How many handlers may run at once, each in a task of its own
    /// (default [`DEFAULT_MAX_DETACHED`], 1024; at least 1). Past it the
    /// layer answers 503 `guard_unavailable` with `Retry-After: 1` *before
    /// claiming the key*: the handler does not run and the key stays free,
    /// so the retry runs normally. A client that gives up does not stop its
    /// handler, so without a bound, clients that send and leave could start
    /// handlers without end. A request holds its slot from before the claim
    /// to its handler's end; one waiting for another's result
    /// ([`wait_for_result`](Self::wait_for_result)) holds one while it waits.
    pub fn max_detached(mut self, handlers: usize) -> Self {
        self.cfg.slots = Arc::new(Semaphore::new(handlers.clamp(1, Semaphore::MAX_PERMITS)));
        self
    }

    /// Tracks this layer's detached handlers in `tasks` (shared), rather
    /// than in a set of its own: one [`DetachedTasks`] then waits for every
    /// layer of a server at shutdown.
    pub fn detached_tasks_in(mut self, tasks: &DetachedTasks) -> Self {
        self.cfg.detached = tasks.clone();
        self
    }

    /// The handle on this layer's detached handlers: close it and wait for
    /// it at shutdown, after the server stopped accepting (see
    /// [`DetachedTasks`]).
    #[must_use]
    pub fn detached_tasks(&self) -> DetachedTasks {
        self.cfg.detached.clone()
    }

    /// Whether a request without `Idempotency-Key` is refused with 400
    /// `missing_idempotency_key` (default) or passed on unguarded.
    pub fn required(mut self, required: bool) -> Self {
        self.cfg.required = required;
        self
    }

    /// How long a completed response is kept and replayed (default 24 h).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.cfg.retention = retention.max(Duration::from_millis(1));
        self
    }

    /// The life of the in-progress record (default 10 s). While the handler
    /// runs it is renewed every third of this; if the process dies, the key
    /// frees itself this long after the last renewal.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.cfg.lease = lease.max(Duration::from_millis(1));
        self
    }

    /// Whether the lease is renewed while the handler runs (default yes).
    /// Without renewal a handler slower than the lease loses its claim: a
    /// retry then runs again, and the slow one's completion is refused.
    pub fn lease_renewal(mut self, renew: bool) -> Self {
        self.cfg.renew = renew;
        self
    }

    /// The largest response body stored (default 1 MiB). A larger one is
    /// passed through whole and its outcome stored without it: a retry gets
    /// the status and `Idempotent-Body: omitted`, and the handler does not
    /// run again.
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.cfg.max_body = bytes;
        self
    }

    /// The largest request body read for the fingerprint (default 64 KiB);
    /// larger gets 413 `payload_too_large`.
    pub fn max_request_body(mut self, bytes: usize) -> Self {
        self.cfg.max_request_body = bytes;
        self
    }

    /// Which responses are stored.
    pub fn store_policy(mut self, policy: StorePolicy) -> Self {
        self.cfg.policy = policy;
        self
    }

    /// While the first request with a key is still running, a repeat gets
    /// 409 `idempotency_key_in_use` with `Retry-After` (`None`, the
    /// default), or waits up to this long for the first one's response and
    /// replays it. If the first one releases the key meanwhile (a 5xx), the
    /// waiting repeat takes the key and runs the handler itself.
    pub fn wait_for_result(mut self, wait: Option<Duration>) -> Self {
        self.cfg.wait = wait;
        self
    }

    /// The response headers stored and replayed (default
    /// [`DEFAULT_REPLAYED_HEADERS`]). `Set-Cookie`, hop-by-hop headers and
    /// `Content-Length` are never stored, even when listed.
    pub fn header_allow_list<I>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = HeaderName>,
    {
        self.cfg.replayed_headers = names.into_iter().filter(|n| !never_stored(n)).collect();
        self
    }

    /// What to do when the store fails (default
    /// [`FailurePolicy::FailClosed`]: 503 `guard_unavailable`). Fail-open
    /// runs the handler without a record: nothing is stored or replayed.
    pub fn on_store_failure(mut self, policy: FailurePolicy) -> Self {
        self.cfg.failure = policy;
        self
    }

    /// Where the caller's id comes from (default header `X-User-Id`). Keys
    /// are scoped by it: two users' equal keys never meet.
    pub fn identity(mut self, identity: impl Identify) -> Self {
        self.cfg.identity = Arc::new(identity);
        self
    }

    /// The route template (`/orders/{id}/pay`), a label for logs and traces
    /// only. The key's scope and the fingerprint always take the concrete
    /// request path, so `/orders/1/pay` and `/orders/2/pay` with one key are
    /// two records, never a replay of each other.
    pub fn route(mut self, template: impl Into<Cow<'static, str>>) -> Self {
        self.cfg.route = Some(template.into());
        self
    }

    /// The key prefix and layout.
    pub fn keys(mut self, keys: KeyBuilder) -> Self {
        self.cfg.keys = keys;
        self
    }

    /// The JSON fields left out of the request fingerprint.
    pub fn fingerprinter(mut self, fingerprinter: Fingerprinter) -> Self {
        self.cfg.fingerprinter = fingerprinter;
        self
    }
}

impl<S, G: Clone> Layer<S> for IdempotencyLayer<G> {
    type Service = Idempotency<S, G>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency::new(inner, Arc::new(self.cfg.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_policy_stores_what_describes_the_request() {
        let p = StorePolicy::Default;
        for s in [200, 201, 204, 400, 410, 422] {
            assert!(p.stores(StatusCode::from_u16(s).unwrap()), "{s}");
        }
        for s in [101, 302, 401, 403, 404, 408, 409, 413, 429, 500, 502, 503] {
            assert!(!p.stores(StatusCode::from_u16(s).unwrap()), "{s}");
        }
        assert!(StorePolicy::All.stores(StatusCode::INTERNAL_SERVER_ERROR));
        assert!(!StorePolicy::SuccessOnly.stores(StatusCode::BAD_REQUEST));
    }

    #[test]
    fn cookies_cannot_be_allowed() {
        let l = IdempotencyLayer::new(()).header_allow_list([
            header::SET_COOKIE,
            header::CONTENT_TYPE,
            header::TRANSFER_ENCODING,
        ]);
        assert_eq!(&*l.cfg.replayed_headers, &[header::CONTENT_TYPE]);
    }
}
