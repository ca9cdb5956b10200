//! The gateway's state, built from the file and swapped on a reload,
//! and the dispatch of each request to its route.

use super::Caller;
use super::access;
use super::caller::with_peer;
use super::count::{Counted, INVALID, Outcome, RouteMetrics, of_code};
use super::forward::{Failure, HttpClient, client, forward};
use super::own;
use super::stack::{
    client_body_broke, invalid_request, outcome_unknown, stack, upstream_timeout,
    upstream_unavailable,
};
use super::store::Connecting;
use crate::config::{
    Config, Guard, OnStoreFailure, StoreUrl, normalize_path, route_spelling, with_slashes_decoded,
    without_format_suffix,
};
use arc_swap::ArcSwap;
use axum::body::Body;
use axum::extract::OriginalUri;
use http::uri::PathAndQuery;
use http::{HeaderName, Request, Response, StatusCode, Uri};
use metrics_exporter_prometheus::PrometheusHandle;
use norepeat::degrade::FailedOpen;
use norepeat::idempotency::DetachedTasks;

use norepeat::idempotency::IDEMPOTENT_REPLAYED;
use norepeat::problem::Problem;
use norepeat::store::{AnyStore, Breaker, Fallback, KeyValueStoreExt, LateAnswers, MemoryStore};
use norepeat::store::{KeyOp, KeyReply, KeyValueStore, RateDecision, RateOp, RateStore};
use norepeat::store::{Resilient, StoreError};
use norepeat::token::{TokenGuard, TokenSigner};
use std::cell::Cell;
use std::convert::Infallible;

use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tower::util::BoxCloneSyncService;

/// The store every route shares: the file's store behind the library's
/// time budget and circuit breaker, and, for the routes that fail open, a
/// bounded local memory behind that ([`Fallback`] over a 64 MiB [`MemoryStore`], keys that
/// expire with their TTL): while the store is down such a route still
/// catches the repeats that reach this instance. A fail-closed route gets
/// the same store without the memory ([`closed`](Self::closed)): a failure
/// stays a failure, and the route refuses.
///
/// ```
/// use norepeat::store::{AnyStore, BreakerState, KeyValueStore};
/// use norepeat_gateway::serve::SharedStore;
/// let open = SharedStore::new(AnyStore::Memory(Default::default()));
/// let closed = open.closed();
/// assert_eq!(closed.circuit().state(), BreakerState::Closed);
/// assert_eq!(open.kind(), "memory");
/// ```
#[derive(Debug, Clone)]
pub struct SharedStore(Fallback<Noted<Resilient<Connecting>>>);

tokio::task_local! {
    /// Set while a request is dispatched when the store failed one of its
    /// decisions (a claim, a rate): a fail-open route then decided against
    /// the local memory, and a request it let through is counted as failed
    /// open, not as passed (see [`dispatch`]).
    static STORE_FAILED: Cell<bool>;
}

/// The file's store as the local memory's [`Fallback`] sees it: a decision
/// it fails is noted for the request being dispatched ([`STORE_FAILED`]).
#[derive(Debug, Clone)]
struct Noted<S>(S);

pub(super) fn note_failure() {
    // Outside a dispatch (a task of its own): nothing to count.
    let _ = STORE_FAILED.try_with(|failed| failed.set(true));
}

impl<S: KeyValueStore> KeyValueStore for Noted<S> {
    async fn execute(&self, op: KeyOp<'_>) -> Result<KeyReply, StoreError> {
        let decision = matches!(op, KeyOp::PutIfAbsent { .. });
        let answer = self.0.execute(op).await;
        if decision && answer.is_err() {
            note_failure();
        }
        answer
    }
    fn kind(&self) -> &'static str {
        self.0.kind()
    }
    fn reconnect(&self) {
        self.0.reconnect();
    }
    fn report_late_answers(&self, to: LateAnswers) {
        self.0.report_late_answers(to);
    }
}

impl<S: RateStore> RateStore for Noted<S> {
    async fn rate(&self, op: RateOp<'_>) -> Result<RateDecision, StoreError> {
        let answer = self.0.rate(op).await;
        if answer.is_err() {
            note_failure();
        }
        answer
    }
}

impl SharedStore {
    /// `store` behind the default budget and breaker, with the local
    /// memory (none over a memory store: it does not fail).
    #[must_use]
    pub fn new(store: AnyStore) -> Self {
        Self::over(Connecting::ready(store))
    }

    fn over(store: Connecting) -> Self {
        let memory = store.kind() == "memory";
        let primary = Noted(Resilient::new(store));
        Self(if memory {
            Fallback::disabled(primary)
        } else {
            Fallback::new(primary, MemoryStore::default())
        })
    }

    /// The same store (its budget, breaker and connections) without the
    /// local memory: for a fail-closed route.
    #[must_use]
    pub fn closed(&self) -> Self {
        Self(Fallback::disabled(self.0.primary().clone()))
    }

    /// This store for a route that follows `policy`.
    fn for_route(&self, policy: OnStoreFailure) -> Self {
        match policy {
            OnStoreFailure::Open => self.clone(),
            OnStoreFailure::Closed => self.closed(),
        }
    }

    /// The breaker in front of the file's store.
    #[must_use]
    pub fn circuit(&self) -> &Breaker {
        self.0.primary().0.circuit()
    }

    /// Whether the file's store has been connected to (one that was down
    /// at start is connected to in the background).
    #[must_use]
    pub fn is_connected(&self) -> bool {
        self.0.primary().0.inner().is_connected()
    }
}

impl KeyValueStore for SharedStore {
    fn execute(&self, op: KeyOp<'_>) -> impl Future<Output = Result<KeyReply, StoreError>> + Send {
        self.0.execute(op)
    }
    fn kind(&self) -> &'static str {
        self.0.kind()
    }
    fn reconnect(&self) {
        self.0.reconnect();
    }
    fn report_late_answers(&self, to: LateAnswers) {
        self.0.report_late_answers(to);
    }
}

impl RateStore for SharedStore {
    fn rate(
        &self,
        op: RateOp<'_>,
    ) -> impl Future<Output = Result<RateDecision, StoreError>> + Send {
        self.0.rate(op)
    }
}

/// A route's whole stack.
pub(super) type RouteService = BoxCloneSyncService<Request<Body>, Response<Body>, Infallible>;

/// The header by which the upstream stage tells an idempotency layer's
/// record that the outcome is unknown (see the module docs). Never sent
/// to a client.
pub const OUTCOME_HEADER: HeaderName = HeaderName::from_static("norepeat-gateway-outcome");

/// How long an unmatched request's upstream has to answer.
pub(super) const PASSTHROUGH_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the random token secret is kept when the file gives none.
pub(super) const SECRET_KEY: &str = "norepeat:gateway:token-secret";

/// The gateway's state: compiled routes, the client, the store.
///
/// ```
/// use norepeat_gateway::config::Config;
/// use norepeat_gateway::serve::Gateway;
/// use tower::ServiceExt;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let config = Config::parse("g.yaml", b"
/// upstream: http://127.0.0.1:9
/// routes:
///   - match: POST /orders/quick
///     guard: fingerprint
/// ")?;
/// let app = Gateway::build(&config, None).await?.into_router();
/// let req = http::Request::get("/.norepeat/healthz").body(axum::body::Body::empty())?;
/// let res = app.oneshot(req).await?;
/// assert_eq!(res.status(), 200);
/// # Ok(()) }
/// ```
pub struct Gateway {
    /// What the file describes; swapped whole on a reload.
    pub(super) live: ArcSwap<Routes>,
    pub(super) client: HttpClient,
    pub(super) store: SharedStore,
    /// The upstream calls of idempotency routes whose client left: a
    /// shutdown waits for them (they complete their keys' records).
    pub(super) detached: DetachedTasks,
    /// Cancelled when a shutdown's grace is over: every upstream call
    /// still waiting then ends as an unknown outcome (see [`super::run`]).
    pub(super) stopping: CancellationToken,
    pub(super) store_url: StoreUrl,
    /// What a client connection may hold (read at start).
    pub(super) limits: crate::config::Limits,
    /// `tls`: the listener's certificate files (read at start, then on
    /// change).
    pub(super) tls: Option<crate::config::Tls>,
    /// `upstream_ca` (read at start).
    pub(super) upstream_ca: Option<crate::config::UpstreamCa>,
    pub(super) metrics: Option<PrometheusHandle>,
    /// Cancelled on `SIGTERM`: readiness answers 503 from then on.
    pub(super) draining: CancellationToken,
    /// How long readiness answers 503 before the listener stops accepting
    /// (read at start).
    pub(super) drain_delay: Duration,
    /// The last reload's result: `None` before any, else `Ok(routes)` or
    /// the reason it was not applied (shown by `healthz`).
    pub(super) last_reload: std::sync::Mutex<Option<Result<usize, String>>>,
    /// Where the access log goes (read at start); `None`: off.
    pub(super) access: Option<access::Sink>,
    /// The admin listener's address (read at start).
    pub(super) admin: Option<std::net::SocketAddr>,
    /// The hash of the admin token (from `admin.token_env`, read at start).
    pub(super) admin_token: Option<blake3::Hash>,
    /// Since when (Unix ms) this store's keys are scoped by site: records
    /// older than that are under the caller alone ([`site_scoped_since`]).
    pub(super) site_scoped_since: Option<u64>,
}

/// Why [`Gateway::build`] failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum BuildError {
    /// The store: its URL cannot be used.
    Store(StoreError),
    /// The access log's file cannot be opened.
    AccessLog(std::io::Error),
    /// `admin.token_env` names a variable that is not set, or too short.
    AdminToken(String),
}

impl std::fmt::Display for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Store(e) => write!(f, "store: {e}"),
            Self::AccessLog(e) => write!(f, "access_log: cannot open the file: {e}"),
            Self::AdminToken(e) => write!(f, "admin.token_env: {e}"),
        }
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Store(e) => Some(e),
            Self::AccessLog(e) => Some(e),
            Self::AdminToken(_) => None,
        }
    }
}

impl From<StoreError> for BuildError {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

/// Where the store keeps when its keys began to be scoped by site.
const SITE_SCOPED_KEY: &str = "norepeat:gateway:site-scoped-since";

/// Since when (Unix ms) the store's idempotency keys are scoped by site as
/// well as by caller (issue 37): the first instance of a release that does
/// so writes the time (one `SET NX`, kept 400 days); every instance reads
/// it. Until a route's `retention` has passed since then, a key with no
/// record under its site-scoped id is looked up under the caller alone,
/// where the release before wrote it, so a retry across the upgrade is
/// replayed, never run again. A store that does not answer gives this
/// start's time (the lookups then last a retention from now: the safe
/// side); a memory store has nothing from before (`None`).
async fn site_scoped_since(store: &SharedStore) -> Option<u64> {
    if store.kind() == "memory" {
        return None;
    }
    let now = super::scope::now_ms();
    let ttl = Duration::from_secs(400 * 24 * 3600);
    let held = store
        .closed()
        .put_if_absent(SITE_SCOPED_KEY, now.to_string().as_bytes(), ttl)
        .await;
    Some(match held {
        Ok(Some(v)) => std::str::from_utf8(&v)
            .ok()
            .and_then(|t| t.parse().ok())
            .unwrap_or(now),
        _ => now,
    })
}

/// The admin token's hash, from the variable `admin.token_env` names.
fn admin_token(config: &Config) -> Result<Option<blake3::Hash>, BuildError> {
    let Some(name) = config.admin.as_ref().and_then(|a| a.token_env.as_deref()) else {
        return Ok(None);
    };
    match std::env::var(name) {
        Ok(t) if t.len() >= 16 => Ok(Some(blake3::hash(t.as_bytes()))),
        Ok(_) => Err(BuildError::AdminToken(format!(
            "{name} holds fewer than 16 characters"
        ))),
        Err(_) => Err(BuildError::AdminToken(format!("{name} is not set"))),
    }
}

/// The part of the gateway a reload replaces.
pub(super) struct Routes {
    pub(super) list: Vec<Compiled>,
    pub(super) upstream: Arc<str>,
    pub(super) caller: Caller,
    /// `cors.allow_origins`: the pages that may ask for a token.
    pub(super) cors: Arc<[String]>,
    /// Issues the tokens; the guard of the fail-open token routes.
    pub(super) tokens: Option<TokenGuard<SharedStore>>,
    /// The same signer over the store without its local memory: the guard
    /// of the fail-closed token routes.
    pub(super) closed_tokens: Option<TokenGuard<SharedStore>>,
    /// Whether any route names a `host` (the request's site is read then).
    pub(super) by_host: bool,
    /// Token routes wait for the secret the store keeps (it was down when
    /// they were built): they follow their failure policy meanwhile.
    pub(super) tokens_pending: bool,
}

pub(super) struct Compiled {
    pub(super) matcher: crate::config::RouteMatch,
    /// `host`: the one site whose requests the route takes.
    pub(super) host: Option<String>,
    /// A guard or a rate limit: a spelling of its path that a back end
    /// would take alike must not pass it by.
    pub(super) guarded: bool,
    /// A guarded route that refuses while the store does not answer.
    pub(super) fails_closed: bool,
    /// An idempotency route's layer: the admin routes read and clear its
    /// records.
    pub(super) records: Option<norepeat::idempotency::IdempotencyLayer<SharedStore>>,
    pub(super) metrics: Arc<RouteMetrics>,
    pub(super) service: RouteService,
}

impl Gateway {
    /// Connects to the file's store (in the background when it does not
    /// answer yet: the gateway serves meanwhile, each route following its
    /// `on_store_failure`) and builds every route.
    ///
    /// # Errors
    /// The store's URL cannot be used, or the access log's file cannot be
    /// opened.
    pub async fn build(
        config: &Config,
        metrics: Option<PrometheusHandle>,
    ) -> Result<Self, BuildError> {
        let store = SharedStore::over(Connecting::connect(config.store.as_url()).await?);
        // Before any client is made: `upstream_ca` is read at start.
        let https = std::iter::once(&config.upstream)
            .chain(config.routes.iter().map(|r| &r.upstream))
            .any(|u| u.as_str().starts_with("https://"));
        super::forward::use_upstream_ca(config.upstream_ca.as_ref(), https);
        let client = client(Duration::from_secs(5));
        let detached = DetachedTasks::new();
        let stopping = CancellationToken::new();
        let site_scoped_since = site_scoped_since(&store).await;
        let routes = Routes::build(
            config,
            &store,
            (&detached, &stopping, site_scoped_since),
            None,
        )
        .await?;
        Ok(Self {
            live: ArcSwap::from_pointee(routes),
            client,
            store,
            detached,
            stopping,
            store_url: config.store.clone(),
            limits: config.limits,
            tls: config.tls.clone(),
            upstream_ca: config.upstream_ca.clone(),
            metrics,
            draining: CancellationToken::new(),
            drain_delay: config.drain_delay,
            last_reload: std::sync::Mutex::new(None),
            access: access::Sink::open(&config.access_log).map_err(BuildError::AccessLog)?,
            admin: config.admin.as_ref().map(|a| a.listen),
            admin_token: admin_token(config)?,
            site_scoped_since,
        })
    }

    /// Replaces the routes, the upstream and the identity with `config`'s,
    /// atomically: a request in flight finishes on the routes it started
    /// on. The store and the listening address stay (they need a restart).
    /// Answers how many routes are served.
    ///
    /// # Errors
    /// The file names another store, the token secret cannot be read, or
    /// the file would remove every route without saying so (`routes: []`:
    /// a file without `routes` is more likely cut short than meant); the
    /// old routes stay.
    pub async fn reload(&self, config: &Config) -> Result<usize, String> {
        if config.store != self.store_url {
            return Err("`store` changed: a new store needs a restart".to_owned());
        }
        if config.tls != self.tls || config.upstream_ca != self.upstream_ca {
            // The rest of the file applies; these wait for a restart (the
            // certificate files themselves are read again on change).
            tracing::warn!("`tls` or `upstream_ca` changed: the new value needs a restart");
        }
        let old = self.live.load();
        if config.routes.is_empty() && !config.routes_given && !old.list.is_empty() {
            return Err(format!(
                "the file has no `routes`, which would remove all {} routes: write `routes: []` to mean it",
                old.list.len()
            ));
        }
        let tokens = old.tokens.clone().zip(old.closed_tokens.clone());
        let shared = (&self.detached, &self.stopping, self.site_scoped_since);
        let routes = Routes::build(config, &self.store, shared, tokens)
            .await
            .map_err(|e| format!("store: {e}"))?;
        let n = routes.list.len();
        self.live.store(Arc::new(routes));
        Ok(n)
    }

    /// The axum app: the own routes under `/.norepeat/`, every other
    /// request through the first route that matches, or straight through.
    pub fn into_router(self) -> axum::Router {
        own::router(Arc::new(self))
    }
}

impl Routes {
    async fn build(
        config: &Config,
        store: &SharedStore,
        (detached, stopping, site_scoped_since): (&DetachedTasks, &CancellationToken, Option<u64>),
        tokens: Option<(TokenGuard<SharedStore>, TokenGuard<SharedStore>)>,
    ) -> Result<Self, StoreError> {
        let caller = Caller::new(&config.identity);
        let wants_tokens = config
            .routes
            .iter()
            .any(|r| matches!(r.guard, Some(Guard::Token)));
        let (tokens, closed_tokens) = match tokens {
            Some((open, closed)) if config.token_secret.is_none() => (
                Some(open.ttl(config.token_ttl)),
                Some(closed.ttl(config.token_ttl)),
            ),
            _ if wants_tokens => {
                // From the store itself, never from the local memory: an
                // instance that made up its own secret would refuse every
                // other instance's tokens.
                match token_secret(config, &store.closed()).await {
                    Ok(secret) => {
                        let signer = TokenSigner::new(secret);
                        (
                            Some(
                                TokenGuard::new(store.clone(), signer.clone())
                                    .ttl(config.token_ttl),
                            ),
                            Some(TokenGuard::new(store.closed(), signer).ttl(config.token_ttl)),
                        )
                    }
                    // The store is down (at start, or before any secret
                    // was read): the token routes follow their failure
                    // policy, and the file's watcher builds them again
                    // until the secret is read.
                    Err(e) => {
                        tracing::warn!(error = %e, "the token secret cannot be read from the store: token routes follow their on_store_failure until it can (or set token_secret)");
                        (None, None)
                    }
                }
            }
            _ => (None, None),
        };
        let tokens_pending = wants_tokens && tokens.is_none();
        let list = config
            .routes
            .iter()
            .map(|r| {
                let metrics = Arc::new(RouteMetrics::new(r.matcher.to_string().into()));
                // A fail-open route decides against the local memory while
                // the store is down; a fail-closed one refuses.
                let tokens = match r.on_store_failure {
                    OnStoreFailure::Open => tokens.as_ref(),
                    OnStoreFailure::Closed => closed_tokens.as_ref(),
                };
                // A route's own identity, else the file's.
                let caller = r
                    .identity
                    .as_ref()
                    .map_or_else(|| caller.clone(), Caller::new);
                let (service, records) = stack(
                    r,
                    &store.for_route(r.on_store_failure),
                    &caller,
                    (detached, stopping, site_scoped_since),
                    tokens,
                    &metrics,
                );
                Compiled {
                    matcher: r.matcher.clone(),
                    host: r.host.clone(),
                    guarded: r.guard.is_some() || r.rate_limit.is_some(),
                    fails_closed: (r.guard.is_some() || r.rate_limit.is_some())
                        && r.on_store_failure == OnStoreFailure::Closed
                        && !r.shadow,
                    service,
                    records,
                    metrics,
                }
            })
            .collect();
        Ok(Self {
            list,
            upstream: config.upstream.as_str().into(),
            caller,
            cors: config.cors.allow_origins.clone().into(),
            tokens,
            closed_tokens,
            by_host: config.routes.iter().any(|r| r.host.is_some()),
            tokens_pending,
        })
    }
}

/// The token secret: the file's (or the environment's), else the one kept
/// in the store, created by the first instance with one `SET NX`.
pub(super) async fn token_secret(
    config: &Config,
    store: &SharedStore,
) -> Result<[u8; 32], StoreError> {
    if let Some(s) = &config.token_secret {
        return Ok(blake3::derive_key(
            "norepeat-gateway token secret v1",
            s.as_bytes(),
        ));
    }
    let mut fresh = [0u8; 32];
    getrandom::fill(&mut fresh).map_err(|e| StoreError::Protocol(format!("no randomness: {e}")))?;
    let hexed = hex::encode(fresh);
    // Keys always expire; ten years is "for as long as the store lives".
    let ttl = Duration::from_secs(10 * 365 * 24 * 3600);
    match store
        .put_if_absent(SECRET_KEY, hexed.as_bytes(), ttl)
        .await?
    {
        None => Ok(fresh),
        Some(held) => hex::decode(&held)
            .ok()
            .and_then(|v| <[u8; 32]>::try_from(v).ok())
            .ok_or_else(|| {
                StoreError::Protocol(format!("{SECRET_KEY} holds no 32-byte hex secret"))
            }),
    }
}

/// Any request not for the gateway's own routes. Routes are matched on
/// the normalized path ([`normalize_path`]); a matched request goes on
/// with that path (its guard's key and the backend see it), an unmatched
/// one is forwarded untouched.
pub(super) async fn dispatch(gw: Arc<Gateway>, mut req: Request<Body>) -> Response<Body> {
    let id = access::request_id(req.headers_mut());
    let Some(sink) = &gw.access else {
        let mut res = route_request(&gw, req).await.0;
        res.headers_mut().insert(access::REQUEST_ID, id);
        return res;
    };
    let started = std::time::Instant::now();
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let ((mut res, route, outcome), upstream) = access::UPSTREAM
        .scope(Cell::new(None), async {
            let answer = route_request(&gw, req).await;
            (answer, access::UPSTREAM.with(Cell::get))
        })
        .await;
    sink.write(&access::Entry {
        request_id: id.to_str().unwrap_or_default(),
        route: route.as_deref().map(RouteMetrics::label),
        method: method.as_str(),
        path: &path,
        status: res.status().as_u16(),
        outcome,
        upstream,
        took: started.elapsed(),
    });
    res.headers_mut().insert(access::REQUEST_ID, id);
    res
}

/// A request through its route (or straight through): the answer, the
/// route that took it, and its outcome as the access log names it.
async fn route_request(
    gw: &Gateway,
    mut req: Request<Body>,
) -> (Response<Body>, Option<Arc<RouteMetrics>>, &'static str) {
    with_peer(req.extensions_mut());
    // The asterisk form (`OPTIONS *`) names no resource: there is no route
    // to match, and no upstream URL to make of it. The client's request,
    // so a 400 of the gateway's, not a 502.
    if let Some(why) = not_forwarded(&req) {
        return (invalid_request(why), None, "invalid_request");
    }
    let live = gw.live.load_full();
    if !live.caller.peer_is_trusted(req.extensions()) {
        // What a client wrote there is not what a proxy of ours saw: the
        // gateway writes its own (in `forward`), never appends to theirs.
        let h = req.headers_mut();
        for name in FORWARDING {
            h.remove(name);
        }
    }
    let normalized = match normalize_path(req.uri().path()) {
        std::borrow::Cow::Borrowed(_) => None,
        std::borrow::Cow::Owned(p) => Some(p),
    };
    let site = live
        .by_host
        .then(|| super::scope::site(req.headers(), req.uri()))
        .flatten();
    let path = normalized.as_deref().unwrap_or(req.uri().path());
    let method = req.method().as_str();
    let find = |p: &str| {
        live.list.iter().find(|r| {
            r.matcher.matches(method, p) && r.host.as_ref().is_none_or(|h| site.as_ref() == Some(h))
        })
    };
    // A format suffix the back end drops (`/payments.json`) is the route
    // too, keyed as its spelling without it.
    let mut keyed = None;
    let mut found = find(path);
    if found.is_none()
        && let Some(plain) = without_format_suffix(path)
    {
        found = find(&plain);
        keyed = found.is_some().then_some(plain);
    }
    if found.is_none()
        && let Some(why) = other_spelling(&live, method, path)
    {
        return (invalid_request(why), None, "invalid_request");
    }
    // A guarded route decides on one request and its one answer: a
    // connection that switches protocols is neither (GATEWAY.md).
    if found.is_some_and(|r| r.guarded) && req.headers().contains_key(http::header::UPGRADE) {
        let why = "A guarded route does not switch protocols: a request with Upgrade (a WebSocket) is refused here.";
        return (invalid_request(why), None, "invalid_request");
    }
    if found.is_some() {
        let key = route_spelling(keyed.as_deref().unwrap_or(path));
        // The common request, already in the route's one spelling, keeps
        // its URI as it is: no copy.
        if normalized.is_some() || *key != *req.uri().path() {
            let key = key.into_owned();
            set_path(&mut req, normalized.as_deref(), &key);
        }
    }
    let Some(route) = found else {
        let start = std::time::Instant::now();
        let answer = forward(&gw.client, &live.upstream, PASSTHROUGH_TIMEOUT, None, req).await;
        access::note_upstream(start.elapsed());
        return match answer {
            Ok(res) => (res, None, "passthrough"),
            Err(Failure::Unavailable) => (upstream_unavailable(), None, "upstream_unavailable"),
            Err(Failure::ClientBody) => (client_body_broke(), None, "invalid_request"),
            Err(Failure::Timeout) => (upstream_timeout(), None, "upstream_timeout"),
        };
    };
    let (res, decided_locally) = STORE_FAILED
        .scope(Cell::new(false), async {
            let res = match route.service.clone().oneshot(req).await {
                Ok(res) => res,
                Err(never) => match never {},
            };
            (res, STORE_FAILED.with(Cell::get))
        })
        .await;
    // Before `finish`, which may answer with a response of its own.
    let store_failed = super::shadow::count(&route.metrics, &res);
    // Let through by the local memory, the store down: failed open.
    // A replay is a replay, whatever decided it (the local memory too).
    let replayed = res.headers().contains_key(IDEMPOTENT_REPLAYED);
    let (res, counted) = finish(res, store_failed || (decided_locally && !replayed));
    route.metrics.count(counted);
    let outcome = match counted {
        Counted::Request(o) => o.as_str(),
        Counted::Invalid(i) => INVALID.get(i).copied().unwrap_or("invalid_request"),
    };
    (res, Some(Arc::clone(&route.metrics)), outcome)
}

/// The forwarding headers a client outside `trusted_proxies` may not set.
const FORWARDING: [&str; 4] = [
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
];

/// Why `req` is not forwarded, if it is one a backend could read otherwise
/// than the gateway did (RFC 9112 asks a server to answer these 400). Both
/// `Content-Length` and `Transfer-Encoding` need no check here: hyper reads
/// such a body by the latter and drops the former. A request without a
/// `Host` is forwarded (the upstream's host is sent): a request built in
/// process, as tests and embedders make them, has none.
fn not_forwarded(req: &Request<Body>) -> Option<&'static str> {
    let headers = req.headers();
    let hosts = headers.get_all(http::header::HOST).iter().count();
    if !req.uri().path().starts_with('/') {
        Some(
            "The gateway forwards requests for a path (a target starting with /); `*` and other forms are not forwarded.",
        )
    } else if req
        .method()
        .as_str()
        .bytes()
        .any(|b| b.is_ascii_lowercase())
    {
        // Methods are case-sensitive (RFC 9110 §9.1), but the backends in
        // front of which the gateway stands are not all so: werkzeug takes
        // `post` for POST. A spelling the backend takes alike must not pass
        // unguarded, so none but the upper case passes.
        Some("The method must be in upper case (`POST`, not `post`).")
    } else if hosts > 1 {
        Some("The request carries more than one Host header.")
    } else if hosts == 0
        && req.version() == http::Version::HTTP_11
        && req.uri().authority().is_none()
        && req
            .extensions()
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .is_some()
    {
        // RFC 9112 §3.2: a server answers 400 to an HTTP/1.1 request
        // without Host. (A request made in process, which has no peer,
        // has none either, and goes on.)
        Some("An HTTP/1.1 request must carry a Host header.")
    } else {
        None
    }
}

/// Why a path that matches no route is refused: a spelling that a back
/// end would take for a route's path, and so run unguarded. An encoded
/// slash (`%2F`) that decodes onto a route (Flask and Express decode it;
/// Envoy can be told to refuse these too), or a path that is a route's in
/// another case (a back end that folds case serves it as the route).
fn other_spelling(live: &Routes, method: &str, path: &str) -> Option<&'static str> {
    const SLASH: &str = "The path has an encoded slash (%2F) that decodes onto a guarded route: refused, as it would reach the route unguarded.";
    const CASE: &str = "The path is a guarded route's in another case: refused, as a back end that folds case would run it unguarded. Use the route's own spelling.";
    let guarded = || live.list.iter().filter(|r| r.guarded);
    let folded = |p: &str| guarded().any(|r| r.matcher.matches_ignoring_case(method, p));
    // The common case, a path that is no route's in any spelling, costs no
    // allocation: one look per route, and the rest only for a path with a
    // suffix or an encoded slash.
    if folded(path) {
        return Some(CASE);
    }
    if let Some(plain) = without_format_suffix(path)
        && folded(&plain)
    {
        return Some(CASE);
    }
    let decoded = with_slashes_decoded(path)?;
    let plain = without_format_suffix(&decoded);
    for p in std::iter::once(decoded.as_str()).chain(plain.as_deref()) {
        if guarded().any(|r| r.matcher.matches(method, p)) {
            return Some(SLASH);
        }
        if folded(p) {
            return Some(CASE);
        }
    }
    None
}

/// Puts `forwarded` (the normalized path, when it differs from the
/// request's) in `req`'s URI, the query kept, and `key` (the route's one
/// spelling, [`route_spelling`]) in axum's `OriginalUri`, which the layers
/// read the concrete path from: the backend sees what was matched, and the
/// guards key every spelling of the route as one.
fn set_path(req: &mut Request<Body>, forwarded: Option<&str>, key: &str) {
    let with_query = |path: &str| match req.uri().query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_owned(),
    };
    let uri_with = |uri: &Uri, path: String| {
        let pq = PathAndQuery::from_maybe_shared(path).ok()?;
        let mut parts = uri.clone().into_parts();
        parts.path_and_query = Some(pq);
        Uri::from_parts(parts).ok()
    };
    let keyed = uri_with(req.uri(), with_query(key));
    if let Some(path) = forwarded
        && let Some(uri) = uri_with(req.uri(), with_query(path))
    {
        *req.uri_mut() = uri;
    }
    if let Some(uri) = keyed {
        req.extensions_mut().insert(OriginalUri(uri));
    }
}

/// Turns the upstream stage's "unknown" record into the client's answer,
/// and names the outcome. `store_failed`: the store failed the request's
/// decision and it went through anyway (a shadowed guard would have
/// refused it, or the local memory of a fail-open route admitted it).
pub(super) fn finish(mut res: Response<Body>, store_failed: bool) -> (Response<Body>, Counted) {
    let replayed = res.headers().contains_key(IDEMPOTENT_REPLAYED);
    if let Some(outcome) = res.headers_mut().remove(OUTCOME_HEADER) {
        if replayed {
            return (outcome_unknown(), Counted::Request(Outcome::Unknown));
        }
        // The backend's own 500 or 504 (its status in the header): the
        // client gets the backend's answer as it was.
        let backend = outcome
            .to_str()
            .ok()
            .and_then(|s| s.parse::<u16>().ok())
            .and_then(|s| StatusCode::from_u16(s).ok());
        if let Some(status) = backend {
            *res.status_mut() = status;
            let open = res.extensions().get::<FailedOpen>().is_some() || store_failed;
            let outcome = if open {
                Outcome::FailOpen
            } else {
                Outcome::Passed
            };
            return (res, Counted::Request(outcome));
        }
        return (
            upstream_timeout(),
            Counted::Request(Outcome::UpstreamTimeout),
        );
    }
    if let Some(p) = res.extensions().get::<Problem>() {
        let counted = of_code(p.code.as_str());
        return (res, counted);
    }
    let outcome = if res.extensions().get::<FailedOpen>().is_some() || store_failed {
        Outcome::FailOpen
    } else if replayed {
        Outcome::Replayed
    } else {
        Outcome::Passed
    };
    (res, Counted::Request(outcome))
}
