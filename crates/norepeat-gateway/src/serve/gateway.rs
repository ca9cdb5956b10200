// Over 400 lines on purpose: the gateway's state and the tasks that keep it (reloads, the epoch, persistence), which change together.
//! The gateway's state: built from the file ([`Gateway::build`]), its
//! routes swapped whole on a reload ([`Gateway::reload`]). One request's
//! path through it is `proxy.rs`.

use crate::config::{Config, StoreUrl};
use crate::serve::log::access;
use crate::serve::route::table::Routes;
use crate::serve::store::{Connecting, SharedStore};
use arc_swap::ArcSwap;
use metrics_exporter_prometheus::PrometheusHandle;
use norepeat::idempotency::DetachedTasks;
use norepeat::store::{KeyValueStore, KeyValueStoreExt, StoreError};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

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
    pub(crate) live: ArcSwap<Routes>,
    pub(crate) store: SharedStore,
    /// `records`: the idempotency routes' store, when it is not `store`.
    pub(crate) records: Option<SharedStore>,
    /// When (Unix ms) the store was last found to have lost its data (its
    /// epoch key gone); 0: never.
    pub(crate) store_lost_data_at: std::sync::atomic::AtomicU64,
    /// Whether the Redis that keeps idempotency records keeps its data
    /// through a restart (AOF or RDB): [`PERSISTENT`], [`FORGETS`], or 0
    /// (not known, or no idempotency records on it).
    pub(crate) store_persistent: std::sync::atomic::AtomicU8,
    /// The upstream calls of idempotency routes whose client left: a
    /// shutdown waits for them (they complete their keys' records).
    pub(crate) detached: DetachedTasks,
    /// Cancelled when a shutdown's grace is over: every upstream call
    /// still waiting then ends as an unknown outcome (see `listen/mod.rs`).
    pub(crate) stopping: CancellationToken,
    pub(crate) store_url: StoreUrl,
    /// What a client connection may hold (read at start).
    pub(crate) limits: crate::config::Limits,
    /// `tls`: the listener's certificate files (read at start, then on
    /// change).
    pub(crate) tls: Option<crate::config::Tls>,
    pub(crate) metrics: Option<PrometheusHandle>,
    /// Set on `SIGTERM`: readiness answers 503 from then on.
    pub(crate) draining: Draining,
    /// How long readiness answers 503 before the listener stops accepting
    /// (read at start).
    pub(crate) drain_delay: Duration,
    /// The last reload's result: `None` before any, else `Ok(routes)` or
    /// the reason it was not applied (shown by `healthz`).
    pub(crate) last_reload: std::sync::Mutex<Option<Result<usize, String>>>,
    /// Where the access log goes (read at start); `None`: off.
    pub(crate) access: Option<access::Sink>,
    /// The admin listener's address (read at start).
    pub(crate) admin: Option<std::net::SocketAddr>,
    /// The admin listener, once bound ([`Gateway::listen_admin`]); taken
    /// by the server.
    pub(crate) admin_listener: std::sync::Mutex<Option<tokio::net::TcpListener>>,
    /// The file in effect: as last applied (at start, or by a reload),
    /// with the fields read at start as they run.
    pub(crate) applied: ArcSwap<Config>,
    /// The hash of the admin token (from `admin.token_env`, read at start).
    pub(crate) admin_token: Option<blake3::Hash>,
    /// Whether the store answered its last probe (`healthz`; probed in
    /// the background, never per request).
    pub(crate) store_answers: Arc<std::sync::atomic::AtomicBool>,
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

/// Set once a stop signal asks the gateway to drain. Read on every
/// request: an atomic load (a `CancellationToken`'s check takes a lock that
/// every worker shares).
#[derive(Debug, Clone, Default)]
pub(crate) struct Draining(Arc<std::sync::atomic::AtomicBool>);

impl Draining {
    pub(crate) fn start(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }

    pub(crate) fn started(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }
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
        let records = match &config.records {
            Some(url) => Some(SharedStore::over(
                Connecting::connect(Some(url.as_url())).await?,
            )),
            None => None,
        };
        // Before any client is made: `upstream_ca` is read at start.
        let https = std::iter::once(&config.upstream)
            .chain(config.routes.iter().map(|r| &r.upstream))
            .flat_map(crate::config::Upstream::servers)
            .any(|u| u.as_str().starts_with("https://"));
        crate::serve::upstream::pool::use_upstream_ca(config.upstream_ca.as_ref(), https);
        crate::serve::upstream::balance::use_health_check(config.health_check.as_ref());
        let detached = DetachedTasks::new();
        let stopping = CancellationToken::new();
        let routes = Routes::build(
            config,
            (&store, records.as_ref()),
            (&detached, &stopping),
            None,
        )
        .await?;
        let store_answers = Arc::new(std::sync::atomic::AtomicBool::new(false));
        tokio::spawn(crate::serve::store::probe_store(
            store.clone(),
            Arc::downgrade(&store_answers),
        ));
        Ok(Self {
            store_lost_data_at: std::sync::atomic::AtomicU64::new(0),
            store_persistent: std::sync::atomic::AtomicU8::new(0),
            records,
            store_answers,
            live: ArcSwap::from_pointee(routes),
            store,
            detached,
            stopping,
            store_url: config.store.clone(),
            limits: config.limits,
            tls: config.tls.clone(),
            metrics,
            draining: Draining::default(),
            drain_delay: config.drain_delay,
            last_reload: std::sync::Mutex::new(None),
            access: access::Sink::open(&config.access_log).map_err(BuildError::AccessLog)?,
            admin: config.admin.as_ref().map(|a| a.listen),
            admin_listener: std::sync::Mutex::new(None),
            admin_token: admin_token(config)?,
            applied: ArcSwap::from_pointee(config.clone()),
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
        {
            // The rest of the file applies; these wait for a restart (the
            // certificate files themselves are read again on change).
            let was = self.applied.load();
            let waiting = config.start_only_changed(&was);
            if !waiting.is_empty() {
                tracing::warn!(fields = ?waiting, "changed fields wait for a restart; the rest of the file applies");
            }
            // Every key names its caller: a changed identity makes the
            // records of requests made before unknown to their retries.
            let rekeyed = config.identity != was.identity
                || config.routes.iter().any(|r| {
                    was.routes
                        .iter()
                        .find(|o| o.matcher == r.matcher && o.host == r.host)
                        .is_some_and(|o| o.identity != r.identity)
                });
            if rekeyed {
                tracing::warn!(
                    "`identity` changed: keys are scoped by the caller, so a retry of a request made before this reload is not recognised (its record is under the old caller) until `retention` ends; change it while clients are not retrying"
                );
            }
        }
        let old = self.live.load();
        if config.routes.is_empty() && !config.routes_given && !old.list.is_empty() {
            return Err(format!(
                "the file has no `routes`, which would remove all {} routes: write `routes: []` to mean it",
                old.list.len()
            ));
        }
        let tokens = old.tokens.clone().zip(old.closed_tokens.clone());
        let shared = (&self.detached, &self.stopping);
        let routes = Routes::build(config, (&self.store, self.records.as_ref()), shared, tokens)
            .await
            .map_err(|e| format!("store: {e}"))?;
        let n = routes.list.len();
        self.live.store(Arc::new(routes));
        // What is in effect: the new file, but the fields read at start as
        // they run (so the next reload compares against those, and a file
        // changed back says nothing).
        let was = self.applied.load();
        let mut effective = config.clone();
        effective.keep_start_only(&was);
        self.applied.store(Arc::new(effective));
        Ok(n)
    }
}

/// The key that tells a store that kept its data from one that lost it.
const EPOCH_KEY: &str = "norepeat:gateway:epoch";
/// Its life: far longer than the refresh, so it only ends with the data.
const EPOCH_TTL: Duration = Duration::from_secs(3600);
/// How often every instance refreshes it (and so notices its loss).
pub(crate) const EPOCH_EVERY: Duration = Duration::from_secs(2);

/// Watches the store's epoch (a random value written `SET NX` at start,
/// its TTL refreshed by every instance every [`EPOCH_EVERY`], so no key
/// lives without one): a store that answers without it lost its data (a
/// Redis without persistence, restarted). Then
/// [`Gateway::store_lost_data`]. A store that does not answer is no loss.
pub(crate) async fn watch_epoch(gw: Arc<Gateway>) {
    if gw.store.kind() == "memory" {
        return;
    }
    let store = gw.store.closed();
    let fresh = || {
        let mut raw = [0u8; 16];
        let _ = getrandom::fill(&mut raw);
        hex::encode(raw)
    };
    // The epoch this instance knows: its own, or the one already there.
    let mut known: Option<Vec<u8>> = None;
    let mut persistence_told = false;
    loop {
        if !persistence_told && known.is_some() {
            persistence_told = gw.check_persistence().await;
        }
        match &known {
            None => {
                let mine = fresh();
                if let Ok(held) = store
                    .put_if_absent(EPOCH_KEY, mine.as_bytes(), EPOCH_TTL)
                    .await
                {
                    known = Some(held.map_or_else(|| mine.into_bytes(), |v| v.to_vec()));
                }
            }
            Some(epoch) => match store.expire_if_equals(EPOCH_KEY, epoch, EPOCH_TTL).await {
                Ok(true) | Err(_) => {}
                Ok(false) => {
                    // Gone (or written anew by an instance that found it
                    // gone first): the data went with it.
                    let mine = fresh();
                    if let Ok(held) = store
                        .put_if_absent(EPOCH_KEY, mine.as_bytes(), EPOCH_TTL)
                        .await
                    {
                        known = Some(held.map_or_else(|| mine.into_bytes(), |v| v.to_vec()));
                        gw.store_lost_data().await;
                        // A store that came back may come back otherwise
                        // configured.
                        persistence_told = false;
                    }
                }
            },
        }
        tokio::time::sleep(EPOCH_EVERY).await;
    }
}

/// `Gateway::store_persistent`: AOF or RDB on.
pub(crate) const PERSISTENT: u8 = 2;
/// `Gateway::store_persistent`: neither: a restart forgets every record.
pub(crate) const FORGETS: u8 = 1;

impl Gateway {
    /// Asks the Redis that keeps idempotency records (no `records:`)
    /// whether it keeps its data through a restart, on a connection of its
    /// own; said once at warn when it does not (a restart forgets every
    /// record, and the retries of requests made before it run again), and
    /// shown in `healthz`. Whether the question was answered (or needs no
    /// answer): `false` asks again at the next look.
    async fn check_persistence(&self) -> bool {
        let url = match &self.store_url {
            StoreUrl::Redis(u) | StoreUrl::Cluster(u) => u.clone(),
            StoreUrl::Memory => return true,
        };
        let keeps_records = self.live.load().list.iter().any(|r| r.records.is_some());
        if self.records.is_some() || !keeps_records {
            return true;
        }
        let Ok(store) = norepeat::store::AnyStore::from_url(Some(&url)).await else {
            return false;
        };
        match store.persistent().await {
            Ok(Some(true)) => {
                self.store_persistent
                    .store(PERSISTENT, std::sync::atomic::Ordering::Release);
            }
            Ok(Some(false)) => {
                self.store_persistent
                    .store(FORGETS, std::sync::atomic::Ordering::Release);
                tracing::warn!(
                    store = self.store.kind(),
                    "the store keeps this file's idempotency records but has neither AOF nor RDB on: a restart of it forgets every record, and the retries of requests made before it run again; turn on appendonly (or a save schedule), or keep the records in a database (records: postgres://... or sqlite:FILE)"
                );
            }
            Ok(None) => {
                tracing::info!(
                    "the store does not say whether it keeps its data through a restart (CONFIG refused): store_persistent is null"
                );
            }
            Err(_) => return false,
        }
        true
    }

    /// The store was found to have lost its data: said once (an error
    /// line, `norepeat_gateway_store_data_lost_total`, `healthz`'s
    /// `store_lost_data_at`), and the token routes built again on the
    /// secret the store holds now (the one a first instance makes anew,
    /// `SET NX`), so that every instance signs and checks with one secret
    /// again (before, an instance started after the loss made a new secret
    /// while the running ones kept the old: forms posted across them got
    /// 409 both ways).
    pub(crate) async fn store_lost_data(&self) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.store_lost_data_at
            .store(now, std::sync::atomic::Ordering::Release);
        metrics::counter!("norepeat_gateway_store_data_lost_total").increment(1);
        tracing::error!(
            store = self.store.kind(),
            "the store lost its data (its epoch key is gone: a restart without persistence?): records and tokens written before are gone; the token secret is read again"
        );
        let config = self.applied.load_full();
        if config.token_secret.is_some() {
            return;
        }
        let shared = (&self.detached, &self.stopping);
        match Routes::build(&config, (&self.store, self.records.as_ref()), shared, None).await {
            Ok(routes) => self.live.store(Arc::new(routes)),
            Err(e) => {
                tracing::warn!(error = %e, "the routes could not be built again after the store's loss")
            }
        }
    }

    /// Binds the admin listener (`admin.listen`), if the file has one and
    /// it is not bound yet, so it accepts from now on; serving takes it
    /// (and binds it itself when this was not called). Called within a
    /// tokio runtime.
    ///
    /// # Errors
    /// The address cannot be listened on.
    pub fn listen_admin(&self) -> std::io::Result<()> {
        let Some(addr) = self.admin else {
            return Ok(());
        };
        let mut held = self
            .admin_listener
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if held.is_none() {
            let cannot = |e: std::io::Error| {
                std::io::Error::new(e.kind(), format!("admin: cannot listen on {addr}: {e}"))
            };
            let socket = if addr.is_ipv4() {
                tokio::net::TcpSocket::new_v4()
            } else {
                tokio::net::TcpSocket::new_v6()
            }
            .map_err(cannot)?;
            socket.set_reuseaddr(true).map_err(cannot)?;
            socket.bind(addr).map_err(cannot)?;
            // The backlog tokio's own `bind` gives: connections past the
            // admin cap wait there, not in the process.
            *held = Some(socket.listen(1024).map_err(cannot)?);
        }
        Ok(())
    }
}
