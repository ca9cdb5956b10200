// Over 400 lines on purpose: the builder and the one request path it configures, which read best together.
//! [`IdempotencyLayer`] and the [`Idempotency`] service it builds: claim
//! the key (through the guard), run the handler, complete or release,
//! replay; and the HTTP answers of the whole capability.

use super::body::Passthrough;
use super::detached::DetachedTasks;
use super::guard::{Abandoned, Claimed, IdempotencyError, IdempotencyGuard};
use super::policy::{DEFAULT_REPLAYED_HEADERS, StorePolicy, StoredHeaders};
use super::reconcile::{IDEMPOTENCY_RECONCILED, Reconcile, Reconciled};
use super::record::{self, Completed, Digest};
use crate::body as request_body;
use crate::claim::{self, Renewer};
use crate::degrade::{FailurePolicy, on_store_error};
use crate::fingerprinter::Fingerprinter;
use crate::identity::{Identify, UserHeader, is_visible_ascii};
use crate::json::InvalidJson;
use crate::keys::KeyBuilder;
use crate::middleware::{
    self, GUARD_UNAVAILABLE, Handle, Middleware, mark, reject, shadowed, unauthenticated, would,
};
use crate::problem::{Code, Problem};
use crate::store::{KeyValueStore, ReadStoreExt, StoreError};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use http_body::Body;
use http_body_util::Either;
use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tower::{Layer, Service};

mod inspect;
mod run;

pub use inspect::{Inspected, RecordState};
use run::{replay, run_claimed};

/// The response body of an idempotent service: the handler's body passed
/// on (possibly after part of it was read), or a stored, replayed or
/// rejection body.
pub type ResponseBody<B> = middleware::ResponseBody<Passthrough<B>>;

/// The request header that carries the client's key.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The response header that marks a replay.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// A response extension: this answer is a stored one, replayed by the
/// layer. Unlike the [`IDEMPOTENT_REPLAYED`] header, which a handler may
/// send on an answer of its own, only the layer puts it there: what a
/// proxy or a metric in front of the layer reads to tell a replay.
///
/// ```
/// use axum::{Router, body::Body, routing::post};
/// use http::Request;
/// use norepeat::idempotency::{IDEMPOTENT_REPLAYED, IdempotencyLayer, Replayed};
/// use norepeat::store::MemoryStore;
/// use tower::ServiceExt;
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// // A handler that claims, wrongly, to replay.
/// let pay = || async { ([(IDEMPOTENT_REPLAYED, "true")], "paid") };
/// let app: Router = Router::new()
///     .route("/payments", post(pay).layer(IdempotencyLayer::new(MemoryStore::default())));
/// let req = || {
///     Request::post("/payments")
///         .header("x-user-id", "u1")
///         .header("idempotency-key", "k1")
///         .body(Body::empty())
///         .unwrap()
/// };
/// let first = app.clone().oneshot(req()).await.unwrap();
/// assert!(first.extensions().get::<Replayed>().is_none());
/// let again = app.oneshot(req()).await.unwrap();
/// assert!(again.extensions().get::<Replayed>().is_some());
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replayed;

/// Which attempt at its key a claimed request is: 1 for the first, one more
/// for each take-over of an abandoned claim ([`Abandoned::Retry`]). The
/// layer puts it into the request's extensions for the handler, so a
/// handler can refuse or reconcile a second attempt (look up the payment
/// the first attempt may have made) instead of repeating it blind.
///
/// ```
/// use axum::{Extension, Router, routing::post};
/// use norepeat::idempotency::{Attempt, IdempotencyLayer};
/// use norepeat::store::MemoryStore;
///
/// async fn pay(Extension(attempt): Extension<Attempt>) -> String {
///     if attempt.get() > 1 {
///         // An earlier attempt was abandoned mid-way: reconcile first.
///     }
///     format!("attempt {}", attempt.get())
/// }
/// let app: Router = Router::new()
///     .route("/payments", post(pay).layer(IdempotencyLayer::new(MemoryStore::default())));
/// # let _ = app;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Attempt(u8);

impl Attempt {
    /// The attempt number, from 1 (at most 255).
    #[must_use]
    pub const fn get(self) -> u8 {
        self.0
    }
}

/// Put in a response's extensions by the inner service when nobody knows
/// whether its effect happened: a call it made downstream timed out, or
/// broke off after the request went out. The layer records the key's
/// outcome as unknown (with the response's status, which the client gets
/// as it is), keeps it for the retention, and refuses every repeat with
/// 409 `idempotency_outcome_unknown`: never run again, never guessed (a
/// 5xx alone frees the key, and the retry would run the effect twice if
/// the first one happened). An operator who checked what happened clears
/// the record ([`IdempotencyLayer::clear`]).
///
/// ```
/// use axum::{Extension, Router, body::Body, routing::post};
/// use http::{Request, StatusCode};
/// use norepeat::idempotency::{IdempotencyLayer, OutcomeUnknown};
/// use norepeat::store::MemoryStore;
/// use tower::ServiceExt;
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// // The payment provider did not answer in time: it may have charged.
/// let pay = || async { (StatusCode::GATEWAY_TIMEOUT, Extension(OutcomeUnknown), "timed out") };
/// let app: Router = Router::new()
///     .route("/payments", post(pay).layer(IdempotencyLayer::new(MemoryStore::default())));
/// let req = || {
///     Request::post("/payments")
///         .header("x-user-id", "u1")
///         .header("idempotency-key", "k1")
///         .body(Body::empty())
///         .unwrap()
/// };
/// assert_eq!(app.clone().oneshot(req()).await.unwrap().status(), StatusCode::GATEWAY_TIMEOUT);
/// // The retry is not run again.
/// assert_eq!(app.oneshot(req()).await.unwrap().status(), StatusCode::CONFLICT);
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutcomeUnknown;

/// A service made idempotent by an [`IdempotencyLayer`].
pub type Idempotency<S, G> = Middleware<IdempotencyLayer<G>, S>;

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
/// Once the key is claimed the handler runs in the request's own future,
/// and moves into a task of its own (`tokio::spawn`) if that future is
/// dropped before the handler ends, so the inner service's future and
/// response must be `Send + 'static` (an axum route's are): a client that
/// gives up does not stop a request that started, and its response is
/// stored for the retry. These handlers are bounded
/// ([`max_detached`](Self::max_detached)) and tracked: wait for them at
/// shutdown through [`detached_tasks`](Self::detached_tasks).
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
///     .wait_for_result(Duration::from_secs(2))
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
///
/// # Shadow mode
/// With [`shadow(true)`](Self::shadow) every key is claimed and every
/// response stored as above, and every request reaches the handler, none
/// refused or replayed: see [`shadow`](Self::shadow).
#[derive(Clone)]
#[must_use]
pub struct IdempotencyLayer<G> {
    /// Claims keys: the store, the lease, the wait and the failure policy.
    guard: IdempotencyGuard<G>,
    keys: KeyBuilder,
    fingerprinter: Fingerprinter,
    identity: Arc<dyn Identify>,
    /// The identity an older configuration gave callers, whose records are
    /// still honoured (see [`previous_identity`](IdempotencyLayer::previous_identity)).
    previous: Option<Arc<dyn Identify>>,
    route: Option<Cow<'static, str>>,
    required: bool,
    retention: Duration,
    renew: bool,
    max_body: usize,
    max_request_body: usize,
    policy: StorePolicy,
    replayed_headers: StoredHeaders,
    /// Renews the claims of handlers that run long, from one task.
    renewer: Renewer<G>,
    /// The detached handlers, for a server to wait for.
    detached: DetachedTasks,
    /// One permit per detached handler that may run at once.
    slots: Arc<Semaphore>,
    /// Decide, count and log, never refuse or replay.
    shadow: bool,
    /// Asked what became of an unknown outcome.
    reconciler: Option<Arc<dyn Reconcile>>,
    /// The key taken from the request itself, not `Idempotency-Key`.
    key_from: Option<KeyFrom>,
}

/// A key taken from a request's head and body ([`IdempotencyLayer::key_from`]).
type KeyFrom = Arc<dyn Fn(&http::request::Parts, &Bytes) -> Option<String> + Send + Sync>;

impl<G> std::fmt::Debug for IdempotencyLayer<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("route", &self.route)
            .field("required", &self.required)
            .field("retention", &self.retention)
            .field("lease", &self.guard.lease)
            .field("policy", &self.policy)
            .field("wait", &self.guard.wait)
            .field("failure", &self.guard.failure)
            .field("shadow", &self.shadow)
            .finish_non_exhaustive()
    }
}

impl<G: Clone> IdempotencyLayer<G> {
    /// A layer keeping its records in `store`, with the defaults above.
    pub fn new(store: G) -> Self {
        Self {
            renewer: Renewer::new(store.clone()),
            guard: IdempotencyGuard {
                store,
                lease: Duration::from_secs(10),
                wait: Duration::ZERO,
                failure: FailurePolicy::FailClosed,
                retention: Duration::from_secs(24 * 3600),
                abandoned: Abandoned::OutcomeUnknown,
                reconciling: false,
                admitted: Arc::default(),
                replayed: Arc::default(),
            },
            keys: KeyBuilder::default(),
            // The whole request: two bodies under one key that differ in
            // any field are two requests (422), whatever the fingerprint
            // guard ignores to catch double clicks.
            fingerprinter: Fingerprinter::ignoring(std::iter::empty::<&str>()),
            identity: Arc::new(UserHeader::default()),
            previous: None,
            route: None,
            required: true,
            retention: Duration::from_secs(24 * 3600),
            renew: true,
            max_body: 1024 * 1024,
            max_request_body: 64 * 1024,
            policy: StorePolicy::Default,
            replayed_headers: StoredHeaders::Only(Arc::from(DEFAULT_REPLAYED_HEADERS)),
            detached: DetachedTasks::new(),
            slots: Arc::new(Semaphore::new(DEFAULT_MAX_DETACHED)),
            shadow: false,
            reconciler: None,
            key_from: None,
        }
    }

    /// Shadow mode (default off): decide, count and log; never refuse, never
    /// replay.
    ///
    /// Every request is decided as it would be, with the same store
    /// operations: the first with a key claims it, runs, and its response
    /// is stored per the [`StorePolicy`] (or the key released), so a repeat
    /// is seen as one. But a request the layer would refuse or answer from
    /// the record reaches the handler anyway, unguarded, as the client sent
    /// it: it claims nothing, its response is not stored, the first one's
    /// record is left as it was, and nothing is replayed (no
    /// `Idempotent-Replayed` answer ever comes from a shadowed layer). Each
    /// is counted in `norepeat_shadow_total{guard="idempotency", would}` and
    /// logged at `info` (guard, would, route, the caller's hash):
    ///
    /// | would answer | `would` |
    /// |---|---|
    /// | the stored response (a replay) | `replay` |
    /// | 409 `idempotency_key_in_use` | `in_progress` |
    /// | 422 `idempotency_key_mismatch` | `mismatch` |
    /// | 400 `missing_idempotency_key` (with [`required`](Self::required), the default) | `missing_idempotency_key` |
    /// | 400 `invalid_idempotency_key` | `invalid_idempotency_key` |
    /// | 401 `unauthenticated` (no caller) | `unauthenticated` |
    /// | 400 `invalid_request` (JSON that does not parse) | `invalid_request` |
    /// | 413 `payload_too_large`, announced by `Content-Length` | `payload_too_large` |
    /// | 503 `guard_unavailable` (the store failed, fail-closed; or [`max_detached`](Self::max_detached) handlers running: this one then runs in the caller's future) | `unavailable` |
    ///
    /// A shadowed layer never waits: [`wait_for_result`](Self::wait_for_result)
    /// would hold the repeat back until the first one ends, and shadow mode
    /// must not change what a request meets. A repeat that arrives while
    /// the first runs is counted `in_progress` at once; enforced with a
    /// wait, it would get the replay once the first one is done, or run
    /// if the first one freed its key. Two answers stay even in shadow mode,
    /// because there is no request left to hand on: a body that grows past
    /// [`max_request_body`](Self::max_request_body) while it is read (413)
    /// and a body whose stream fails (400). A fail-open layer whose store
    /// fails lets the request through in either mode and counts nothing
    /// here. Turning shadow off refuses and replays the requests shadow
    /// mode counted.
    ///
    /// The decision also goes into the response's extensions, as an entry
    /// of its [`ShadowedBy`](crate::shadow::ShadowedBy), for code outside
    /// the layer to read (a gateway counting by route).
    ///
    /// ```
    /// use axum::{Router, body::Body, routing::post};
    /// use http::{Request, StatusCode};
    /// use norepeat::idempotency::IdempotencyLayer;
    /// use norepeat::store::MemoryStore;
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use tower::ServiceExt;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let payments = Arc::new(AtomicUsize::new(0));
    /// let counted = Arc::clone(&payments);
    /// let app: Router = Router::new().route(
    ///     "/payments",
    ///     post(move || async move {
    ///         counted.fetch_add(1, Ordering::SeqCst);
    ///         StatusCode::CREATED
    ///     })
    ///     .layer(IdempotencyLayer::new(MemoryStore::default()).route("/payments").shadow(true)),
    /// );
    /// let pay = || {
    ///     Request::post("/payments")
    ///         .header("x-user-id", "u1")
    ///         .header("idempotency-key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
    ///         .body(Body::from("amount=1999"))
    ///         .unwrap()
    /// };
    /// assert_eq!(app.clone().oneshot(pay()).await.unwrap().status(), StatusCode::CREATED);
    /// // Would be a replay: counted (would="replay") and logged, but the handler runs.
    /// let again = app.oneshot(pay()).await.unwrap();
    /// assert!(again.headers().get("idempotent-replayed").is_none());
    /// assert_eq!(payments.load(Ordering::SeqCst), 2);
    /// # }
    /// ```
    pub fn shadow(mut self, on: bool) -> Self {
        self.shadow = on;
        self
    }

    /// How many handlers may run at once, each carried to its end even
    /// when its client leaves (default [`DEFAULT_MAX_DETACHED`], 1024; at least 1). Past it the
    /// layer answers 503 `guard_unavailable` with `Retry-After: 1` *before
    /// claiming the key*: the handler does not run and the key stays free,
    /// so the retry runs normally. A client that gives up does not stop its
    /// handler, so without a bound, clients that send and leave could start
    /// handlers without end. A request holds its slot from before the claim
    /// to its handler's end; one waiting for another's result
    /// ([`wait_for_result`](Self::wait_for_result)) holds one while it waits.
    pub fn max_detached(mut self, handlers: usize) -> Self {
        self.slots = Arc::new(Semaphore::new(handlers.clamp(1, Semaphore::MAX_PERMITS)));
        self
    }

    /// Tracks this layer's detached handlers in `tasks` (shared), rather
    /// than in a set of its own: one [`DetachedTasks`] then waits for every
    /// layer of a server at shutdown.
    pub fn detached_tasks_in(mut self, tasks: &DetachedTasks) -> Self {
        self.detached = tasks.clone();
        self
    }

    /// The handle on this layer's detached handlers: close it and wait for
    /// it at shutdown, after the server stopped accepting (see
    /// [`DetachedTasks`]).
    #[must_use]
    pub fn detached_tasks(&self) -> DetachedTasks {
        self.detached.clone()
    }

    /// Whether a request without `Idempotency-Key` is refused with 400
    /// `missing_idempotency_key` (default) or passed on unguarded.
    pub fn required(mut self, required: bool) -> Self {
        self.required = required;
        self
    }

    /// How long a completed response is kept and replayed (default 24 h),
    /// and how long the record of a request that never completed is kept
    /// (see [`abandoned`](Self::abandoned)).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention.max(Duration::from_millis(1));
        self.guard.retention = self.retention;
        self
    }

    /// What a repeat does with a claim whose owner is gone (default
    /// [`Abandoned::OutcomeUnknown`]): a request whose lease passed with no
    /// renewal and no answer stored, because its process was killed (an OOM
    /// kill, a node lost, a deploy whose grace ran out) or lost its store
    /// for a whole lease. Its handler may have had its effect, so by
    /// default every repeat gets 409 `idempotency_outcome_unknown` and the
    /// handler never runs again for that key. [`Abandoned::Retry`] lets one
    /// repeat take the claim over and run the handler again, as
    /// [`Attempt`] 2: right where the effect commits with the record
    /// ([`IdempotentTx`](super::IdempotentTx): an abandoned claim's
    /// transaction never committed, so it ran no effect) or the handler
    /// reconciles a second attempt.
    ///
    /// ```
    /// use norepeat::idempotency::{Abandoned, IdempotencyLayer};
    /// use norepeat::store::MemoryStore;
    /// let layer = IdempotencyLayer::new(MemoryStore::default()).abandoned(Abandoned::Retry);
    /// # let _ = layer;
    /// ```
    pub fn abandoned(mut self, abandoned: Abandoned) -> Self {
        self.guard.abandoned = abandoned;
        self
    }

    /// Takes each request's key from the request itself instead of the
    /// `Idempotency-Key` header: `key` gets its head and its body (read
    /// under [`max_request_body`](Self::max_request_body)) and gives the
    /// key, or `None` (the request goes on unguarded). So a repeat of a
    /// form the client cannot give a key gets the first answer: keyed by
    /// its one-time token, or by its content (a hash of the fields that
    /// name the operation). The key is scoped by caller, method and path
    /// as a client's is.
    ///
    /// ```
    /// use norepeat::idempotency::IdempotencyLayer;
    /// use norepeat::store::MemoryStore;
    /// // The order form's own number: a second click gets the first order.
    /// let layer = IdempotencyLayer::new(MemoryStore::default()).key_from(|_head, body| {
    ///     let form = std::str::from_utf8(body).ok()?;
    ///     form.split('&').find_map(|f| f.strip_prefix("formId=")).map(str::to_owned)
    /// });
    /// # let _ = layer;
    /// ```
    pub fn key_from(
        mut self,
        key: impl Fn(&http::request::Parts, &Bytes) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.key_from = Some(Arc::new(key));
        self
    }

    /// Asks `hook` what became of an unknown outcome (a request marked
    /// [`OutcomeUnknown`], or a claim abandoned under
    /// [`Abandoned::OutcomeUnknown`]) when a repeat meets it, instead of
    /// refusing every repeat until the record ends: the effect happened
    /// (its answer is stored and replayed, with
    /// `Idempotency-Reconciled: true`), did not (the repeat takes the key
    /// over and runs as the next [`Attempt`]), or is still unknown (409).
    /// See [`Reconcile`] for an example. Not asked in shadow mode.
    pub fn reconcile(mut self, hook: impl Reconcile) -> Self {
        self.reconciler = Some(Arc::new(hook));
        self
    }

    /// The lease of a running request (default 10 s): its deadline is
    /// written in its in-progress record, and moved every third of the
    /// lease while the handler runs. A record whose deadline has passed was
    /// abandoned (see [`abandoned`](Self::abandoned)). Renewal starts when
    /// the handler first waits (its first `.await` that is not ready): a
    /// handler that blocks its thread longer than the lease before that
    /// (synchronous I/O; put it in `spawn_blocking`) may lose its key.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.guard.lease = lease.max(Duration::from_millis(1));
        self
    }

    /// Whether the lease is renewed while the handler runs (default yes).
    /// Without renewal a handler slower than the lease loses its claim: a
    /// retry then runs again, and the slow one's completion is refused.
    pub fn lease_renewal(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }

    /// The largest response body stored (default 1 MiB). A larger one is
    /// passed through whole and its outcome stored without it: a retry gets
    /// the status and `Idempotent-Body: omitted`, and the handler does not
    /// run again.
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// The largest request body read for the fingerprint (default 64 KiB);
    /// larger gets 413 `payload_too_large`.
    pub fn max_request_body(mut self, bytes: usize) -> Self {
        self.max_request_body = bytes;
        self
    }

    /// Which responses are stored.
    pub fn store_policy(mut self, policy: StorePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// While the first request with a key is still running, a repeat gets
    /// 409 `idempotency_key_in_use` with `Retry-After` (`Duration::ZERO`,
    /// the default), or waits up to this long for the first one's response
    /// and replays it. If the first one releases the key meanwhile (a 5xx),
    /// the waiting repeat takes the key and runs the handler itself.
    pub fn wait_for_result(mut self, wait: Duration) -> Self {
        self.guard.wait = wait;
        self
    }

    /// The response headers stored and replayed (default
    /// [`DEFAULT_REPLAYED_HEADERS`]). `Set-Cookie`, hop-by-hop headers and
    /// `Content-Length` are never stored, even when listed. The same as
    /// [`stored_headers`](Self::stored_headers)`(StoredHeaders::only(names))`.
    pub fn header_allow_list<I>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = HeaderName>,
    {
        self.replayed_headers = StoredHeaders::only(names);
        self
    }

    /// Which response headers are stored and replayed (default
    /// [`StoredHeaders::default`], the [`DEFAULT_REPLAYED_HEADERS`]).
    /// [`StoredHeaders::AllButHopByHop`] replays the first answer's headers
    /// as they were, but `Set-Cookie`, the hop-by-hop ones and
    /// `Content-Length`: what a reverse proxy needs.
    ///
    /// ```
    /// use axum::{Router, body::Body, routing::post};
    /// use norepeat::idempotency::{IdempotencyLayer, StoredHeaders};
    /// use norepeat::store::MemoryStore;
    /// use tower::ServiceExt;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let layer = IdempotencyLayer::new(MemoryStore::default())
    ///     .stored_headers(StoredHeaders::AllButHopByHop);
    /// let app: Router = Router::new().route(
    ///     "/payments",
    ///     post(|| async { ([("x-order", "o-7"), ("set-cookie", "s=1")], "paid") }).layer(layer),
    /// );
    /// let pay = || {
    ///     http::Request::post("/payments")
    ///         .header("x-user-id", "u1")
    ///         .header("idempotency-key", "k-1")
    ///         .body(Body::empty())
    ///         .unwrap()
    /// };
    /// let _first = app.clone().oneshot(pay()).await.unwrap();
    /// let again = app.oneshot(pay()).await.unwrap();
    /// assert_eq!(again.headers()["idempotent-replayed"], "true");
    /// assert_eq!(again.headers()["x-order"], "o-7");
    /// assert!(again.headers().get("set-cookie").is_none());
    /// # }
    /// ```
    pub fn stored_headers(mut self, which: StoredHeaders) -> Self {
        self.replayed_headers = which;
        self
    }

    /// What to do when the store fails (default
    /// [`FailurePolicy::FailClosed`]: 503 `guard_unavailable`). Fail-open
    /// runs the handler without a record: nothing is stored or replayed.
    pub fn on_store_failure(mut self, policy: FailurePolicy) -> Self {
        self.guard.failure = policy;
        self
    }

    /// Where the caller's id comes from (default header `X-User-Id`). Keys
    /// are scoped by it: two users' equal keys never meet.
    pub fn identity(mut self, identity: impl Identify) -> Self {
        self.identity = Arc::new(identity);
        self
    }

    /// The identity an older configuration (or release) gave the same
    /// callers, while its records may still be retried: a change of
    /// [`identity`](Self::identity) changes every key, and a retry of a
    /// request first made under the old one must still be replayed (or
    /// refused), never run again. A request whose key has a record under
    /// its previous identity (one read, before the claim, and only when the
    /// two ids differ) goes on under that identity; any other under the
    /// current one. A read that fails is no answer: a fail-closed layer
    /// refuses the request (503), a fail-open one goes on to its claim. Return `None` from it once the change is older than
    /// the [`retention`](Self::retention) (no record of the old scope is
    /// left), so the read stops.
    ///
    /// A race is left while the two configurations serve side by side (a
    /// rolling deployment): an instance of the old one may claim the old
    /// key after this one found it empty. Change the identity while
    /// clients are not retrying across the two, or drain the old instances
    /// first.
    ///
    /// ```
    /// use norepeat::idempotency::IdempotencyLayer;
    /// use norepeat::identity::UserHeader;
    /// use norepeat::store::MemoryStore;
    /// // Keys were scoped by `X-User-Id`; they are now by `X-Account`.
    /// let layer = IdempotencyLayer::new(MemoryStore::default())
    ///     .identity(UserHeader::new(http::HeaderName::from_static("x-account")))
    ///     .previous_identity(UserHeader::default());
    /// ```
    pub fn previous_identity(mut self, identity: impl Identify) -> Self {
        self.previous = Some(Arc::new(identity));
        self
    }

    /// The route template (`/orders/{id}/pay`), a label for logs and traces
    /// only. The key's scope and the fingerprint always take the concrete
    /// request path, so `/orders/1/pay` and `/orders/2/pay` with one key are
    /// two records, never a replay of each other.
    pub fn route(mut self, template: impl Into<Cow<'static, str>>) -> Self {
        self.route = Some(template.into());
        self
    }

    /// The key prefix and layout.
    pub fn keys(mut self, keys: KeyBuilder) -> Self {
        self.keys = keys;
        self
    }

    /// How a request's fingerprint is computed, which decides whether a
    /// request under a used key is the same one (a replay, or 409) or
    /// another (422). Default: the whole request, no JSON field left out
    /// (unlike the fingerprint guard, which leaves out
    /// [`DEFAULT_IGNORED_FIELDS`](crate::fingerprint::DEFAULT_IGNORED_FIELDS)
    /// to catch double clicks: under one key, a body that differs in any
    /// field is another request).
    pub fn fingerprinter(mut self, fingerprinter: Fingerprinter) -> Self {
        self.fingerprinter = fingerprinter;
        self
    }
}

impl<S, G: Clone> Layer<S> for IdempotencyLayer<G> {
    type Service = Idempotency<S, G>;

    fn layer(&self, inner: S) -> Self::Service {
        let mut layer = self.clone();
        if layer.shadow {
            // A shadowed repeat is decided at once (see `shadow`).
            layer.guard.wait = Duration::ZERO;
        }
        layer.guard.reconciling = layer.reconciler.is_some() && !layer.shadow;
        Middleware::new(inner, layer)
    }
}

impl<S, G, ReqBody, ResBody> Handle<S, ReqBody, ResBody> for IdempotencyLayer<G>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    G: KeyValueStore + Clone,
    ReqBody: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqBody::Error: std::error::Error + Send + Sync + 'static,
    ResBody: Body + Send + 'static,
    ResBody::Error: Send + 'static,
{
    type Body = ResponseBody<ResBody>;

    fn handle(
        self: Arc<Self>,
        inner: S,
        req: Request<ReqBody>,
    ) -> impl Future<Output = Result<Response<Self::Body>, S::Error>> + Send + 'static {
        handle(self, inner, req)
    }
}

fn pass<B: Body>(res: Response<B>) -> Response<ResponseBody<B>> {
    res.map(|b| Either::Left(Passthrough::new(b)))
}

/// The client's key: `Ok(None)` when absent. The draft sends it as a
/// structured-field string (`"abc"`); the quotes are dropped, so `"abc"` and
/// `abc` are the same key.
fn client_key(headers: &HeaderMap) -> Result<Option<&str>, Problem> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(v) = values.next() else {
        return Ok(None);
    };
    let invalid = || {
        Problem::new(Code::InvalidIdempotencyKey)
            .detail("Idempotency-Key must be one value of 1 to 255 visible ASCII characters.")
    };
    if values.next().is_some() {
        return Err(invalid());
    }
    let mut b = v.as_bytes();
    if b.len() >= 2 && b[0] == b'"' && b[b.len() - 1] == b'"' {
        b = &b[1..b.len() - 1];
    }
    if !is_visible_ascii(b, 255) {
        return Err(invalid());
    }
    // Visible ASCII is valid UTF-8.
    std::str::from_utf8(b).map(Some).map_err(|_| invalid())
}

/// What a request meets instead of its handler: a refusal, or the first
/// request's stored answer.
enum Refusal {
    Problem(Problem),
    Replay(Completed),
}

impl From<Problem> for Refusal {
    fn from(p: Problem) -> Self {
        Refusal::Problem(p)
    }
}

/// Answers `refusal`; in shadow mode counts and logs it instead and hands
/// `req` on unguarded: no claim, no record, nothing replayed, and the
/// handler gets the request as the client sent it.
async fn refuse<S, G, ReqBody, ResBody>(
    cfg: &IdempotencyLayer<G>,
    mut inner: S,
    refusal: Refusal,
    req: Request<ReqBody>,
    user: Option<&str>,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body,
{
    if let Refusal::Replay(_) = refusal {
        // The decision as taken, shadowed or not (refusals are counted
        // where the guard decides them).
        cfg.guard
            .replayed
            .get_or_init(|| metrics::counter!("norepeat_decisions_total", "mode" => "idempotency", "outcome" => "replayed"))
            .increment(1);
    }
    if !cfg.shadow {
        return Ok(match refusal {
            Refusal::Problem(p) => reject(&p),
            Refusal::Replay(done) => replay(done),
        });
    }
    let would = match &refusal {
        Refusal::Problem(p) => would(p.code),
        Refusal::Replay(_) => "replay",
    };
    let (parts, body) = req.into_parts();
    let route = (cfg.route.as_deref()).unwrap_or(crate::request::client_path(&parts));
    let s = shadowed("idempotency", would, route, user);
    Ok(mark(
        pass(inner.call(Request::from_parts(parts, body)).await?),
        s,
    ))
}

async fn handle<S, G, ReqBody, ResBody>(
    cfg: Arc<IdempotencyLayer<G>>,
    mut inner: S,
    req: Request<ReqBody>,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    G: KeyValueStore + Clone,
    ReqBody: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqBody::Error: std::error::Error + Send + Sync + 'static,
    ResBody: Body + Send + 'static,
    ResBody::Error: Send + 'static,
{
    let (parts, body) = req.into_parts();
    let Some(user) = cfg.identity.identify(&parts) else {
        let p = unauthenticated(&*cfg.identity);
        return refuse(
            &cfg,
            inner,
            p.into(),
            Request::from_parts(parts, body),
            None,
        )
        .await;
    };
    let user = user.as_str();
    let header_key = match client_key(&parts.headers) {
        // The key is the request's own (`key_from`): read with its body.
        _ if cfg.key_from.is_some() => None,
        Ok(Some(k)) => Some(k),
        Ok(None) if cfg.required => {
            let p = Problem::new(Code::MissingIdempotencyKey).detail(
                "This operation needs an Idempotency-Key header; send a new random key (a UUID) per operation, and the same one on every retry of it.",
            );
            let req = Request::from_parts(parts, body);
            return refuse(&cfg, inner, p.into(), req, Some(user)).await;
        }
        Ok(None) => return Ok(pass(inner.call(Request::from_parts(parts, body)).await?)),
        Err(p) => {
            let req = Request::from_parts(parts, body);
            return refuse(&cfg, inner, p.into(), req, Some(user)).await;
        }
    };
    if cfg.shadow && crate::body::declares_over(&parts.headers, cfg.max_request_body) {
        // Refused before a byte is read: the body is still whole.
        let max = cfg.max_request_body;
        let p = Problem::from(request_body::BodyError::TooLarge { max });
        let req = Request::from_parts(parts, body);
        return refuse(&cfg, inner, p.into(), req, Some(user)).await;
    }
    let bytes = match request_body::read(body, cfg.max_request_body, &parts.headers).await {
        Ok(b) => b,
        // Nothing left to hand on, even in shadow mode.
        Err(e) => return Ok(reject(&Problem::from(e))),
    };
    let derived = cfg.key_from.as_ref().and_then(|from| from(&parts, &bytes));
    let Some(client_key) = derived.as_deref().or(header_key) else {
        // No key of the request's own: it goes on unguarded, as a request
        // without a key under `required(false)`.
        let req = Request::from_parts(parts, ReqBody::from(bytes));
        return Ok(pass(inner.call(req).await?));
    };
    // The scope and the fingerprint take the concrete path: `/orders/1/pay`
    // and `/orders/2/pay` are different resources. The template is a label.
    let path = crate::request::client_path(&parts);
    let route = cfg.route.as_deref().unwrap_or(path);
    // A record under the caller's previous identity (a changed
    // configuration) is this request's: it goes on as that caller.
    let previous = match previous_scope(&cfg, &parts, user, path, client_key).await {
        Ok(previous) => previous,
        // Fail-open: the claim that follows meets the same store and
        // decides (and counts) by the same policy.
        Err(_) if cfg.guard.failure == FailurePolicy::FailOpen => None,
        // Fail-closed: a record that could not be read may be this very
        // request's, made under the previous identity; claiming the key
        // under the new one would run it again.
        Err(e) => match on_store_error("idempotency", cfg.guard.failure, e) {
            Ok(()) => None,
            Err(e) => {
                let req = Request::from_parts(parts, ReqBody::from(bytes));
                let p = Problem::from(IdempotencyError::Unavailable(e));
                return refuse(&cfg, inner, p.into(), req, Some(user)).await;
            }
        },
    };
    let user = previous.as_deref().unwrap_or(user);
    let key = cfg.record_key(user, &parts.method, path, client_key);
    // A body declared JSON that does not parse is the client's error: 400
    // before any claim, as the fingerprint guard answers (one rule for both
    // layers; the key stays free for the corrected request).
    let fingerprint = match fingerprint_of(&cfg, user, path, &parts, &bytes) {
        Ok(fp) => fp,
        Err(e) => {
            let req = Request::from_parts(parts, ReqBody::from(bytes));
            return refuse(&cfg, inner, Problem::from(e).into(), req, Some(user)).await;
        }
    };

    // The bound on detached handlers, before the claim: a request refused
    // here leaves the key free, and its retry runs normally. (In shadow
    // mode it runs here, in the caller's future, unguarded.)
    let Ok(slot) = Arc::clone(&cfg.slots).try_acquire_owned() else {
        metrics::counter!("norepeat_decisions_total", "mode" => "idempotency", "outcome" => "rejected", "reason" => "max_detached").increment(1);
        let p = Problem::new(Code::GuardUnavailable)
            .detail("Too many requests are being processed; retry shortly with the same key.")
            .retry_after_secs(1);
        let req = Request::from_parts(parts, ReqBody::from(bytes));
        return refuse(&cfg, inner, p.into(), req, Some(user)).await;
    };
    // The slot bounds the handlers that own a key: a request that owns none
    // (answered at once, or run in its caller's future by shadow mode or a
    // failing store) gives it back before it goes on.
    let claimed = match cfg.guard.claim(&key, &fingerprint).await {
        Claimed::Unknown { existing, attempt } => {
            let at = Unknown {
                key: &key,
                client_key,
                existing: &existing,
                attempt,
            };
            reconciled(&cfg, &parts, at, &fingerprint).await
        }
        claimed => claimed,
    };
    let (claim, owner, attempt) = match claimed {
        Claimed::Owned(c, owner, attempt) => (c, owner, attempt),
        Claimed::Done(done) => {
            drop(slot);
            let req = Request::from_parts(parts, ReqBody::from(bytes));
            return refuse(&cfg, inner, Refusal::Replay(done), req, Some(user)).await;
        }
        Claimed::Unknown { .. } => {
            drop(slot);
            let req = Request::from_parts(parts, ReqBody::from(bytes));
            let p = Problem::from(IdempotencyError::OutcomeUnknown);
            return refuse(&cfg, inner, p.into(), req, Some(user)).await;
        }
        Claimed::Refused(e) => {
            drop(slot);
            let req = Request::from_parts(parts, ReqBody::from(bytes));
            return refuse(&cfg, inner, Problem::from(e).into(), req, Some(user)).await;
        }
        Claimed::Unguarded => {
            drop(slot);
            let req = Request::from_parts(parts, ReqBody::from(bytes));
            return Ok(middleware::failed_open(
                pass(inner.call(req).await?),
                "idempotency",
            ));
        }
    };
    tracing::debug!(user, route, "idempotency key claimed");

    // From here the work is carried to its end: it runs in this future
    // while the caller waits, and moves into a task of its own the moment
    // the caller gives up (a disconnected client, a timeout layer), so its
    // result is stored all the same and a retry gets the replay (or 409
    // while it still runs). The claim is never freed early. The work holds
    // the slot: a handler whose client left still counts.
    let mut req = Request::from_parts(parts, ReqBody::from(bytes));
    req.extensions_mut().insert(Attempt(attempt));
    let tracker = cfg.detached.tracker().clone();
    let local = claim.decided_locally();
    claim::detach_tracked(
        &tracker,
        Box::pin(async move {
            let out = run_claimed(cfg, inner, req, claim, (owner, attempt), fingerprint).await;
            drop(slot);
            match out {
                Ok(res) if local => Ok(middleware::decided_locally(res, "idempotency")),
                out => out,
            }
        }),
    )
    .await
}

/// An unknown outcome met by a repeat: the store key, the client's key,
/// the record's bytes and its attempt.
struct Unknown<'a> {
    key: &'a str,
    client_key: &'a str,
    existing: &'a Bytes,
    attempt: u8,
}

/// Asks the [`Reconcile`] hook what became of the unknown outcome `at`,
/// and settles the key by its answer (see the `reconcile` module).
async fn reconciled<G: KeyValueStore + Clone>(
    cfg: &IdempotencyLayer<G>,
    parts: &http::request::Parts,
    at: Unknown<'_>,
    fingerprint: &Digest,
) -> Claimed<G> {
    let count = |result: &'static str| {
        metrics::counter!("norepeat_idempotency_reconciled_total", "result" => result).increment(1);
    };
    let Some(hook) = cfg.reconciler.as_ref() else {
        return Claimed::Refused(IdempotencyError::OutcomeUnknown);
    };
    match hook.reconcile(parts, at.client_key).await {
        Reconciled::Done(res) => {
            count("done");
            let (head, body) = res.into_parts();
            let mut headers: Vec<(HeaderName, HeaderValue)> = cfg
                .replayed_headers
                .select(&head.headers)
                .map(|(n, v)| (n.clone(), v.clone()))
                .collect();
            headers.push((IDEMPOTENCY_RECONCILED, HeaderValue::from_static("true")));
            let pairs = headers.iter().map(|(n, v)| (n, v));
            let bytes = if body.len() <= cfg.max_body {
                record::completed(&[0; 16], fingerprint, head.status, pairs, &body)
            } else {
                record::completed_without_body(&[0; 16], fingerprint, head.status, pairs)
            };
            // What a later repeat replays, as it decodes it.
            let Ok(record::Record {
                completed: Some(done),
                ..
            }) = record::decode(&Bytes::from(bytes.clone()))
            else {
                return Claimed::Refused(IdempotencyError::OutcomeUnknown);
            };
            cfg.guard
                .settle(
                    at.key,
                    at.existing,
                    fingerprint,
                    at.attempt,
                    Some((bytes, done)),
                )
                .await
        }
        Reconciled::Absent => {
            count("absent");
            cfg.guard
                .settle(at.key, at.existing, fingerprint, at.attempt, None)
                .await
        }
        Reconciled::Unknown => {
            count("unknown");
            metrics::counter!("norepeat_decisions_total", "mode" => "idempotency", "outcome" => "rejected", "reason" => "outcome_unknown").increment(1);
            Claimed::Refused(IdempotencyError::OutcomeUnknown)
        }
    }
}

/// The caller's previous identity, when
/// [`previous_identity`](IdempotencyLayer::previous_identity) gives one that
/// differs and the store holds a record for this key under it.
///
/// # Errors
/// The store cannot say.
async fn previous_scope<G: KeyValueStore + Clone>(
    cfg: &IdempotencyLayer<G>,
    parts: &http::request::Parts,
    user: &str,
    path: &str,
    client_key: &str,
) -> Result<Option<String>, StoreError> {
    let Some(previous) = cfg.previous.as_ref().and_then(|p| p.identify(parts)) else {
        return Ok(None);
    };
    if previous == user {
        return Ok(None);
    }
    let key = cfg.record_key(&previous, &parts.method, path, client_key);
    Ok(cfg.guard.store.get(&key).await?.map(|_| previous))
}

/// 128 bits of the request's fingerprint: caller, method, concrete path, query,
/// canonical body and the body's media type. The fingerprint guard's rule: a body whose content type
/// says JSON must parse (else the error, answered 400); one that only looks
/// like JSON and does not parse is hashed as bytes. The media type
/// (`Content-Type` without its parameters, in lower case) is part of the
/// request: `a=1` as a form and as text are two requests to a backend, so
/// one key sent with each is a mismatch (422), not a replay.
fn fingerprint_of<G>(
    cfg: &IdempotencyLayer<G>,
    user: &str,
    route: &str,
    parts: &http::request::Parts,
    body: &Bytes,
) -> Result<Digest, InvalidJson> {
    let fp = cfg
        .fingerprinter
        .fingerprint_http(user, parts, route, body)?;
    let Some(media) = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .map(|v| {
            v.as_bytes()
                .split(|&b| b == b';')
                .next()
                .unwrap_or_default()
                .trim_ascii()
        })
        .filter(|m| !m.is_empty())
    else {
        return Ok(kept(&fp));
    };
    // The keyed hash of the fingerprint and the media type in lower case.
    // A common media type fits beside the fingerprint on the stack and is
    // hashed at once; a derive-key hasher hashed its context string at
    // every call, and its streaming hasher is set up for a few bytes (a
    // replay through the gateway: 46.9k -> 45.9k instructions, by
    // callgrind).
    let mut joined = [0u8; 32 + 96];
    let digest = match joined.get_mut(32..32 + media.len()) {
        Some(room) => {
            room.copy_from_slice(media);
            room.make_ascii_lowercase();
            joined[..32].copy_from_slice(&fp.0);
            blake3::keyed_hash(MEDIA_KEY, &joined[..32 + media.len()])
        }
        None => {
            let mut h = blake3::Hasher::new_keyed(MEDIA_KEY);
            h.update(&fp.0);
            h.update(&media.to_ascii_lowercase());
            h.finalize()
        }
    };
    Ok(kept(&crate::fingerprint::Digest(*digest.as_bytes())))
}

/// The key of the hash that joins a request's fingerprint and its media
/// type (a fixed key: it names a domain, it is not a secret).
const MEDIA_KEY: &[u8; 32] = b"norepeat idempotency media v2 ..";

/// The 128 bits of a fingerprint a record keeps.
fn kept(fp: &crate::fingerprint::Digest) -> Digest {
    let mut out = [0; 16];
    out.copy_from_slice(&fp.0[..16]);
    out
}

impl From<IdempotencyError> for Problem {
    fn from(e: IdempotencyError) -> Self {
        match e {
            IdempotencyError::InUse => Problem::new(Code::IdempotencyKeyInUse)
                .detail("A request with this Idempotency-Key is still being processed; retry shortly with the same key.")
                .retry_after_secs(1),
            IdempotencyError::Mismatch => Problem::new(Code::IdempotencyKeyMismatch).detail(
                "This Idempotency-Key was used with a different request; use a new key for a new operation.",
            ),
            IdempotencyError::OutcomeUnknown => Problem::new(Code::IdempotencyOutcomeUnknown).detail(
                "The request that held this Idempotency-Key ended without a known outcome (it timed out, or its server stopped mid-request); whether it took effect is unknown, so it is not run again. Check the outcome before sending a new operation with a new key.",
            ),
            IdempotencyError::Unavailable(_) => Problem::new(Code::GuardUnavailable)
                .detail(GUARD_UNAVAILABLE)
                .retry_after_secs(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderValue, header};

    #[test]
    fn cookies_cannot_be_allowed() {
        let l = IdempotencyLayer::new(()).header_allow_list([
            header::SET_COOKIE,
            header::CONTENT_TYPE,
            header::TRANSFER_ENCODING,
        ]);
        assert_eq!(
            l.replayed_headers,
            StoredHeaders::Only(Arc::from([header::CONTENT_TYPE]))
        );
    }

    fn headers(values: &[&[u8]]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(IDEMPOTENCY_KEY, HeaderValue::from_bytes(v).unwrap());
        }
        h
    }

    #[test]
    fn keys_are_validated() {
        assert_eq!(client_key(&headers(&[])).unwrap(), None);
        assert_eq!(client_key(&headers(&[b"abc"])).unwrap(), Some("abc"));
        assert_eq!(client_key(&headers(&[b"\"abc\""])).unwrap(), Some("abc"));
        assert!(client_key(&headers(&[&[b'k'; 255]])).unwrap().is_some());
        for bad in [&b""[..], b"\"\"", &[b'k'; 256], b"a b", b"\xc3\xa9"] {
            assert!(client_key(&headers(&[bad])).is_err(), "{bad:?}");
        }
        assert!(client_key(&headers(&[b"a", b"b"])).is_err());
    }

    /// The media type joins the fingerprint by one keyed hash, whatever
    /// its length (a short one is hashed from the stack, a long one
    /// streamed) and in any case.
    #[test]
    fn the_media_type_joins_the_fingerprint_alike_at_any_length() {
        let l = IdempotencyLayer::new(());
        let of = |media: &str| {
            let (parts, ()) = Request::post("/orders")
                .header(header::CONTENT_TYPE, media)
                .body(())
                .unwrap()
                .into_parts();
            let body = Bytes::from_static(b"a=1");
            fingerprint_of(&l, "u", "/orders", &parts, &body).unwrap()
        };
        let bare = l
            .fingerprinter
            .fingerprint_http(
                "u",
                &Request::post("/orders").body(()).unwrap().into_parts().0,
                "/orders",
                b"a=1",
            )
            .unwrap();
        let joined = |media: &str| {
            let mut bytes = bare.0.to_vec();
            bytes.extend_from_slice(media.to_ascii_lowercase().as_bytes());
            kept(&crate::fingerprint::Digest(
                *blake3::keyed_hash(MEDIA_KEY, &bytes).as_bytes(),
            ))
        };
        let long = format!("application/{}", "x".repeat(120));
        for media in [
            "text/plain",
            "Application/X-WWW-Form-Urlencoded",
            long.as_str(),
        ] {
            assert_eq!(of(media), joined(media), "{media}");
            assert_eq!(of(&format!("{media}; charset=utf-8")), joined(media));
        }
        assert_eq!(of("TEXT/PLAIN"), of("text/plain"));
        assert_ne!(of("text/plain"), of("application/x-www-form-urlencoded"));
    }
}
