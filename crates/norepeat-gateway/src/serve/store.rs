// Over 400 lines on purpose: the store every route shares: connected in the background, one connection set per worker, the local memory and the health probe.
//! The store every route shares ([`SharedStore`]): the file's store,
//! connected in the background when it is down at start (the gateway
//! starts and serves either way: a rollout must not wait on Redis, and the
//! routes follow their `on_store_failure` until the store answers), behind
//! the library's budget and breaker, with a bounded local memory for the
//! routes that fail open.

use crate::config::OnStoreFailure;
use norepeat::store::{
    AnyStore, Breaker, DecidedBy, Fallback, KeyOp, KeyReply, KeyValueStore, LateAnswers,
    MemoryStore, RateDecision, RateOp, RateStore, Resilient, StoreError,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// The file's store, or the promise of it: every call fails with
/// [`StoreError::Connection`] until a connection is made (retried every
/// [`RETRY`] in a task of its own), then goes to the store.
#[derive(Debug, Clone)]
pub(crate) struct Connecting {
    kind: &'static str,
    store: Arc<OnceLock<Stores>>,
    /// Where late answers are reported, passed on once connected (the
    /// budget asks for them once, at its start).
    late: Arc<Mutex<Late>>,
}

/// Where late answers go, and whether the stores connected so far were
/// told (a worker's store made later is told when it is made).
#[derive(Debug, Default)]
struct Late {
    to: Option<LateAnswers>,
    passed: bool,
}

/// How often a store that was down at start is tried again.
pub(crate) const RETRY: Duration = Duration::from_secs(1);

impl Connecting {
    /// A store that is there.
    pub(crate) fn ready(store: AnyStore) -> Self {
        Self::ready_at(store, None)
    }

    /// A store that is there, connected from `url` (for the other
    /// workers' connections).
    fn ready_at(store: AnyStore, url: Option<&str>) -> Self {
        let kind = store.kind();
        Self {
            kind,
            store: Arc::new(OnceLock::from(Stores::new(store, url))),
            late: Arc::default(),
        }
    }

    /// Connects to `url` (`None`: memory). A store that cannot be reached
    /// is connected to in the background, and logged; a URL that is wrong
    /// is an error.
    pub(crate) async fn connect(url: Option<&str>) -> Result<Self, StoreError> {
        match AnyStore::from_url(url).await {
            Ok(store) => Ok(Self::ready_at(store, url)),
            Err(e @ StoreError::InvalidUrl(_)) => Err(e),
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "the store does not answer: serving anyway, every route following its on_store_failure until it does (tried again every second)"
                );
                let pending = Self {
                    kind: match url {
                        Some(u) if u.starts_with("redis+cluster://") => "cluster",
                        Some(u) if u.starts_with("postgres") => "postgres",
                        Some(u) if u.starts_with("sqlite:") => "sqlite",
                        _ => "redis",
                    },
                    store: Arc::new(OnceLock::new()),
                    late: Arc::default(),
                };
                let url = url.map(str::to_owned);
                let store = Arc::downgrade(&pending.store);
                let late = Arc::clone(&pending.late);
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(RETRY).await;
                        let Some(slot) = store.upgrade() else { return };
                        if let Ok(s) = AnyStore::from_url(url.as_deref()).await {
                            let _ = slot.set(Stores::new(s, url.as_deref()));
                            pass_late(&slot, &late);
                            tracing::info!("the store answers: connected");
                            return;
                        }
                    }
                });
                Ok(pending)
            }
        }
    }

    /// Whether the store is connected.
    pub(crate) fn is_connected(&self) -> bool {
        self.store.get().is_some()
    }

    fn get(&self) -> Result<&AnyStore, StoreError> {
        self.store
            .get()
            .map(|s| s.mine(&self.store, &self.late))
            .ok_or_else(|| StoreError::Connection("not connected yet".to_owned()))
    }
}

/// The connected store: one for the process, or, for one Redis server
/// served by per-core workers, one per worker: worker 0's is the store
/// connected at start (its connection tasks on the main thread), each
/// other worker's a connection of its own, made on its thread once it is
/// first called, so a call and its answer stay on one thread (on two
/// cores, one worker spent 14-16 % less CPU per guarded request than two
/// sharing the main thread's connections: BENCHMARKS.md, issue 39).
/// Commands on one key from two workers may then leave on two
/// connections, as from two instances: every same-key pair the guards
/// send is owner-checked.
#[derive(Debug)]
enum Stores {
    One(AnyStore),
    PerWorker {
        first: AnyStore,
        url: String,
        others: crate::serve::workers::PerWorker<Own>,
    },
}

/// A worker's own store, connected in the background: until it is, the
/// worker's calls go over worker 0's connections. Before, the first call
/// made it, and the connection's handshake counted in that call's time
/// budget: on a loaded machine a payment's first call on a worker ran
/// past the 50 ms a fast store is given, and a fail-closed route refused
/// it with 503.
#[derive(Debug, Default)]
struct Own {
    store: OnceLock<AnyStore>,
    /// A connection is being made, or failed less than [`RETRY`] ago.
    connecting: AtomicBool,
}

impl Stores {
    fn new(store: AnyStore, url: Option<&str>) -> Self {
        match (&store, url) {
            // Not behind Sentinel: a worker's own store is made lazily,
            // and a Sentinel's master must be asked for first (its one
            // store follows the master for every worker).
            (AnyStore::Redis(_), Some(url))
                if crate::serve::workers::count() > 1
                    && !url.starts_with("redis+sentinel://")
                    && !url.starts_with("rediss+sentinel://") =>
            {
                Self::PerWorker {
                    first: store,
                    url: url.to_owned(),
                    others: crate::serve::workers::PerWorker::new(Own::default),
                }
            }
            _ => Self::One(store),
        }
    }

    /// The calling worker's store: its own once connected (told where to
    /// report late answers), worker 0's until then. The first call starts
    /// the connection, in a task on the worker's runtime (`this` is where
    /// `self` lives, for that task).
    fn mine<'a>(&'a self, this: &Arc<OnceLock<Stores>>, late: &Arc<Mutex<Late>>) -> &'a AnyStore {
        let (first, url, others) = match self {
            Self::One(store) => return store,
            Self::PerWorker { first, url, others } => (first, url, others),
        };
        if crate::serve::workers::index() == 0 {
            return first;
        }
        let own = others.get();
        if let Some(store) = own.store.get() {
            return store;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current()
            && !own.connecting.swap(true, Ordering::AcqRel)
        {
            let (this, late, url) = (Arc::clone(this), Arc::clone(late), url.clone());
            // On this worker's single-threaded runtime: the connection's
            // tasks run on its thread, and `others.get()` is its own.
            runtime.spawn(async move {
                let made = norepeat::store::RedisStore::connect_with(&url, 1).await;
                let Some(Self::PerWorker { others, .. }) = this.get() else {
                    return;
                };
                let own = others.get();
                match made {
                    Ok(made) => {
                        // Made and told under the lock `pass_late` takes:
                        // told once.
                        let late = late.lock().unwrap_or_else(|p| p.into_inner());
                        let store = own.store.get_or_init(|| AnyStore::Redis(made));
                        if late.passed
                            && let Some(to) = late.to.clone()
                        {
                            store.report_late_answers(to);
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "a worker's own store connection failed: its calls stay on the first worker's");
                        tokio::time::sleep(RETRY).await;
                        own.connecting.store(false, Ordering::Release);
                    }
                }
            });
        }
        first
    }

    /// Every store made so far.
    fn all(&self) -> impl Iterator<Item = &AnyStore> {
        let (first, others) = match self {
            Self::One(store) => (store, None),
            Self::PerWorker { first, others, .. } => (first, Some(others)),
        };
        std::iter::once(first).chain(
            others
                .into_iter()
                .flat_map(|o| o.all().filter_map(|own| own.store.get())),
        )
    }
}

impl KeyValueStore for Connecting {
    async fn execute(&self, op: KeyOp<'_>) -> Result<KeyReply, StoreError> {
        self.get()?.execute(op).await
    }
    fn kind(&self) -> &'static str {
        self.kind
    }
    fn reconnect(&self) {
        if let Some(stores) = self.store.get() {
            stores.all().for_each(AnyStore::reconnect);
        }
    }
    fn report_late_answers(&self, to: LateAnswers) {
        // Kept (for the stores made later, a worker's on its first call),
        // then passed on if the store is there by now: whichever of this
        // and the connecting task passes it last passes it on.
        self.late.lock().unwrap_or_else(|p| p.into_inner()).to = Some(to);
        pass_late(&self.store, &self.late);
    }
}

/// Passes the kept late-answer target on to the stores, once they are
/// there (kept: a worker's store made later gets it too).
fn pass_late(store: &OnceLock<Stores>, late: &Mutex<Late>) {
    let mut late = late.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(stores) = store.get()
        && !late.passed
        && let Some(to) = late.to.clone()
    {
        stores.all().for_each(|s| s.report_late_answers(to.clone()));
        late.passed = true;
    }
}

impl RateStore for Connecting {
    async fn rate(&self, op: RateOp<'_>) -> Result<RateDecision, StoreError> {
        self.get()?.rate(op).await
    }
}

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
pub struct SharedStore(Fallback<Boxed<Resilient<Connecting>>>);

/// The file's store as the local memory's [`Fallback`] sees it: each call
/// boxed.
#[derive(Debug, Clone)]
struct Boxed<S>(S);

impl<S: KeyValueStore> KeyValueStore for Boxed<S> {
    async fn execute(&self, op: KeyOp<'_>) -> Result<KeyReply, StoreError> {
        // Boxed: the store's chain of futures (breaker, local memory,
        // Redis batch) is kilobytes, moved whole at every level of every
        // guard that awaits it; a box is one move and a pointer
        // (BENCHMARKS.md, issue 39).
        Box::pin(self.0.execute(op)).await
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

impl<S: RateStore> RateStore for Boxed<S> {
    async fn rate(&self, op: RateOp<'_>) -> Result<RateDecision, StoreError> {
        Box::pin(self.0.rate(op)).await
    }
}

impl SharedStore {
    /// `store` behind the default budget and breaker, with the local
    /// memory (none over a memory store: it does not fail).
    #[must_use]
    pub fn new(store: AnyStore) -> Self {
        Self::over(Connecting::ready(store))
    }

    pub(crate) fn over(store: Connecting) -> Self {
        let memory = store.kind() == "memory";
        let primary = Boxed(Resilient::new(store));
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
    pub(crate) fn for_route(&self, policy: OnStoreFailure) -> Self {
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
    // Passed on: a guard learns from it that the local memory admitted a
    // request, and the response says so (`DecidedLocally`).
    fn execute_decided(
        &self,
        op: KeyOp<'_>,
    ) -> impl Future<Output = Result<(KeyReply, DecidedBy), StoreError>> + Send {
        self.0.execute_decided(op)
    }
}

impl RateStore for SharedStore {
    fn rate(
        &self,
        op: RateOp<'_>,
    ) -> impl Future<Output = Result<RateDecision, StoreError>> + Send {
        self.0.rate(op)
    }
    fn rate_decided(
        &self,
        op: RateOp<'_>,
    ) -> impl Future<Output = Result<(RateDecision, DecidedBy), StoreError>> + Send {
        self.0.rate_decided(op)
    }
}

/// The key the health probe asks about. Nothing writes it: the probe
/// is a conditional delete whose condition cannot hold, so it changes
/// nothing and creates no key.
const PROBE_KEY: &str = "norepeat:gateway:readyz";

/// How often the store is probed for `healthz`.
const PROBE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Asks the store whether it answers, every [`PROBE_EVERY`], into
/// `answers`, until the gateway is gone: one conditional delete whose
/// condition never holds (it writes nothing; the store trait has no
/// `PING`), through the same budget and breaker as every guard.
pub(crate) async fn probe_store(
    store: SharedStore,
    answers: std::sync::Weak<std::sync::atomic::AtomicBool>,
) {
    use norepeat::store::KeyValueStoreExt;
    loop {
        let ok = store
            .delete_if_equals(PROBE_KEY, b"\0never written")
            .await
            .is_ok();
        let Some(answers) = answers.upgrade() else {
            return;
        };
        answers.store(ok, std::sync::atomic::Ordering::Release);
        drop(answers);
        tokio::time::sleep(PROBE_EVERY).await;
    }
}
