// Over 400 lines on purpose: one Redis's pool and the following of a Sentinel's master share the pool's slots and client (following a master is replacing them).
//! One Redis server, over a few multiplexed connections: one named by its
//! address, or the master a set of Sentinels names (followed when it
//! moves).

use super::batch::{self, Queue, Ticket};
use super::sentinel::{self, Discovery};
use super::url::{self, Replicas};
use super::{Backend, Connections, Scripts, map_err};
use crate::store::{LateAnswers, StoreError, redact_url};
use arc_swap::ArcSwap;
use futures_util::FutureExt;
use redis::aio::ConnectionManager;
use redis::{Cmd, RedisResult, Value};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// One Redis server, through [`DEFAULT_CONNECTIONS`] [`ConnectionManager`]s
/// that multiplex the calls and reconnect after a failure.
///
/// Calls (a claim's `SET NX`, a script's `EVALSHA`) that arrive together
/// leave as one pipeline per connection: one write for the client and one
/// read for Redis instead of one each per call, each call still its own
/// atomic command with its own answer (see BENCHMARKS.md, "Claims that
/// arrive together leave together").
///
/// Cheap to clone; clones share the connections.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), norepeat::store::StoreError> {
/// let store = norepeat::store::RedisStore::connect("redis://127.0.0.1:6379").await?;
/// # Ok(()) }
/// ```
///
/// # Sentinel
///
/// `redis+sentinel://[user:password@]host:port,host:port/MASTER_NAME`
/// (`rediss+sentinel://` for TLS, as `rediss://`) names the Sentinels and
/// the master's name: the store asks the Sentinels where the master is,
/// and asks again when a call there gets no answer or is answered
/// `READONLY` (after a failover); when the master moved, every connection
/// is replaced, and those to the old master dropped. The credentials are
/// the master's; the Sentinels are asked without them.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), norepeat::store::StoreError> {
/// let store = norepeat::store::RedisStore::connect(
///     "redis+sentinel://10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379/mymaster?replicas=1",
/// ).await?;
/// # Ok(()) }
/// ```
///
/// # Replicas
///
/// `?replicas=N[&replicas_timeout=T]` (on any of the URLs above; `T` as
/// `50ms` or `1s`, 100 ms unless given, at most 1 s): every batch that
/// carries a claim or a completion ends with `WAIT N T` on its
/// connection, and a claim or completion that fewer than `N` replicas
/// acknowledged within `T` fails with [`StoreError::Server`] (it ran on the
/// master; a failover before the replicas copy it would lose it). Any
/// other query parameter but redis-rs's `protocol` is an error.
#[derive(Clone)]
pub struct RedisStore(Backend<Pool>);

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("connections", &self.0.con.0.slots.len())
            .finish()
    }
}

/// How many multiplexed connections a [`RedisStore`] spreads its calls over
/// by default. One connection serialises every write and read through one
/// socket and one task; two let the client use both cores of a small
/// machine (see BENCHMARKS.md).
pub const DEFAULT_CONNECTIONS: usize = 2;

impl RedisStore {
    /// Whether the server keeps its data through a restart: AOF on or an
    /// RDB save schedule (`Some(true)`), neither (`Some(false)`: a restart
    /// forgets every key), or `None` when it will not say (`CONFIG`
    /// refused).
    ///
    /// # Errors
    /// The server does not answer.
    pub async fn persistent(&self) -> Result<Option<bool>, StoreError> {
        self.0.persistent().await
    }

    /// Connects to the Redis at `url` (`redis://host:port/db`) with
    /// [`DEFAULT_CONNECTIONS`] multiplexed connections.
    ///
    /// # Errors
    /// [`StoreError::InvalidUrl`] when the URL is not a Redis URL (it says
    /// how one looks; nothing is sent), a connection error naming the
    /// server when the first connection fails. A password in the URL shows
    /// as `***` in either.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, DEFAULT_CONNECTIONS).await
    }

    /// Connects with `connections` multiplexed connections (at least one).
    /// Each key has its connection (by a hash of the key), so the commands
    /// on one key leave in the order they were called.
    ///
    /// # Errors
    /// [`StoreError::InvalidUrl`] when the URL is not a Redis URL (it says
    /// how one looks; nothing is sent), a connection error naming the
    /// server when the first connection fails. A password in the URL shows
    /// as `***` in either.
    pub async fn connect_with(url: &str, connections: usize) -> Result<Self, StoreError> {
        let (client, replicas, sentinel) = if url::is_sentinel(url) {
            let discovery = discovery(url)?;
            let client = discovery.0.master().await.map_err(|e| {
                at(
                    url,
                    StoreError::Connection(format!(
                        "no master named {:?} found through the Sentinels: {e}",
                        discovery.0.name()
                    )),
                )
            })?;
            (client, discovery.1, Some(Arc::new(discovery.0)))
        } else {
            let (client, replicas) = open(url)?;
            (client, replicas, None)
        };
        let mut managers = Vec::new();
        for _ in 0..connections.max(1) {
            managers.push(
                ConnectionManager::new_with_config(client.clone(), manager_config())
                    .await
                    .map_err(|e| at(url, map_err(e)))?,
            );
        }
        Ok(Self::with_pool(client, managers, replicas, sentinel))
    }

    /// Like [`connect`](Self::connect), but connects on first use: a store
    /// for a process that must start while Redis is down (its calls fail,
    /// and the guards' failure policy applies, until Redis answers).
    ///
    /// # Errors
    /// [`StoreError::InvalidUrl`] when the URL is not a Redis URL.
    pub fn connect_lazy(url: &str) -> Result<Self, StoreError> {
        Self::connect_lazy_with(url, DEFAULT_CONNECTIONS)
    }

    /// Like [`connect_lazy`](Self::connect_lazy), with `connections`
    /// multiplexed connections (at least one). A connection's tasks run on
    /// the runtime the store is made on: a server with one single-threaded
    /// runtime per core makes one such store on each, so a call and its
    /// answer stay on one thread.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// // Nothing is sent until the first call.
    /// let store = norepeat::store::RedisStore::connect_lazy_with("redis://127.0.0.1:6379", 1).unwrap();
    /// # drop(store); }
    /// ```
    ///
    /// # Errors
    /// [`StoreError::InvalidUrl`] when the URL is not a Redis URL, or is a
    /// Sentinel URL (its master must be asked for first: use
    /// [`connect`](Self::connect)).
    pub fn connect_lazy_with(url: &str, connections: usize) -> Result<Self, StoreError> {
        if url::is_sentinel(url) {
            return Err(StoreError::InvalidUrl(format!(
                "{:?}: a Sentinel URL is connected to with RedisStore::connect (the Sentinels must name the master first)",
                redact_url(url)
            )));
        }
        let (client, replicas) = open(url)?;
        let managers = (0..connections.max(1))
            .map(|_| ConnectionManager::new_lazy_with_config(client.clone(), manager_config()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| at(url, map_err(e)))?;
        Ok(Self::with_pool(client, managers, replicas, None))
    }

    fn with_pool(
        client: redis::Client,
        managers: Vec<ConnectionManager>,
        replicas: Option<Replicas>,
        sentinel: Option<Arc<Discovery>>,
    ) -> Self {
        Self(Backend {
            con: Pool(Arc::new(PoolInner {
                client: ArcSwap::from_pointee(client),
                replicas,
                sentinel,
                slots: managers
                    .into_iter()
                    .map(|m| Slot {
                        manager: ArcSwap::from_pointee(m),
                        queue: Queue::default(),
                    })
                    .collect(),
                late: Mutex::new(Vec::new()),
            })),
            scripts: Arc::new(Scripts::new()),
        })
    }
}

/// How a good URL looks, for the errors of a bad one.
const LOOKS_LIKE: &str = "a Redis URL looks like redis://[[user]:password@]host:port[/db] or rediss:// for TLS, or redis+sentinel://[[user]:password@]host:port,host:port/MASTER_NAME, each with ?replicas=N&replicas_timeout=T if asked";

/// Why `url` is no Redis URL: `why`, the URL with its password replaced
/// by `***`, and how a good one looks.
pub(super) fn invalid(url: &str, why: &dyn std::fmt::Display) -> StoreError {
    StoreError::InvalidUrl(format!("{:?} ({why}); {LOOKS_LIKE}", redact_url(url)))
}

/// The client of `url` and the replicas it asks for, or why the URL is no
/// Redis URL.
fn open(url: &str) -> Result<(redis::Client, Option<Replicas>), StoreError> {
    let (rest, replicas) = url::split_settings(url, &["protocol"]).map_err(|e| invalid(url, &e))?;
    let client = redis::Client::open(&*rest).map_err(|e| invalid(url, &e))?;
    Ok((client, replicas))
}

/// The Sentinels of a Sentinel URL and the replicas it asks for, or why
/// the URL is no such URL.
fn discovery(url: &str) -> Result<(Discovery, Option<Replicas>), StoreError> {
    let parsed = url::sentinel(url).map_err(|e| invalid(url, &e))?;
    let discovery = Discovery::new(&parsed).map_err(|e| invalid(url, &e))?;
    Ok((discovery, parsed.replicas))
}

/// `error`, naming the server it came from (`url` without its password).
pub(super) fn at(url: &str, error: StoreError) -> StoreError {
    let url = redact_url(url);
    match error {
        StoreError::Connection(e) => StoreError::Connection(format!("{url}: {e}")),
        StoreError::Server(e) => StoreError::Server(format!("{url}: {e}")),
        StoreError::Protocol(e) => StoreError::Protocol(format!("{url}: {e}")),
        other => other,
    }
}

/// The response timeout bounds a batch on a connection whose replies
/// stopped coming: its calls fail after it instead of waiting for a
/// [`Pool::reconnect`]. It is longer than the longest default budget of
/// [`Resilient`](crate::store::Resilient) (300 ms), so that the answer of a
/// slow store still comes after its caller gave up, and is reported (see
/// [`batch`]): cut at redis-rs's default of 500 ms, an answer of a store
/// 300 ms away each way never came, and the store looked silent.
pub(super) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// The settings of every connection (see [`RESPONSE_TIMEOUT`]).
pub(super) fn manager_config() -> redis::aio::ConnectionManagerConfig {
    redis::aio::ConnectionManagerConfig::new()
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500))
}

/// A few connection managers, each key on one of them. Each call clones
/// one (an `Arc`); the slots are read without a lock or a shared counter.
/// Cloning the pool (every clone of the store) is one `Arc`.
#[derive(Clone)]
struct Pool(Arc<PoolInner>);

struct PoolInner {
    /// The server's client; behind Sentinel, the master's of the moment
    /// (replaced by [`follow_master`]).
    client: ArcSwap<redis::Client>,
    /// The replicas each claim and completion waits for.
    replicas: Option<Replicas>,
    /// The Sentinels that name the server, when they do.
    sentinel: Option<Arc<Discovery>>,
    slots: Box<[Slot]>,
    /// Where the answers that came after their callers gave up are
    /// reported (see [`batch`]); read only when such an answer comes.
    late: Mutex<Vec<LateAnswers>>,
}

impl PoolInner {
    /// Reports one late answer to every live target, forgetting the gone.
    fn report_late(&self, took: Duration) {
        self.late
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|to| to.report(took));
    }
}

/// One connection and the calls waiting for its next write.
struct Slot {
    /// Replaced whole by [`Pool::reconnect`].
    manager: ArcSwap<ConnectionManager>,
    queue: Queue,
}

impl Pool {
    /// The index of `key`'s slot: every command on one key goes through one
    /// connection, so a release cannot overtake the completion sent before
    /// it on another connection. Keys spread evenly (a hash), at the cost of
    /// a few nanoseconds and no allocation.
    fn slot_of(&self, key: &str) -> usize {
        let n = self.0.slots.len();
        if n == 1 {
            return 0;
        }
        // usize is at most 64 bits, and the remainder is below `n`.
        #[allow(clippy::cast_possible_truncation)]
        let index = (spread(key.as_bytes()) % n as u64) as usize;
        index
    }
}

/// FNV-1a over `bytes`, its high bits folded into the low ones (which
/// alone decide a remainder by a small count).
fn spread(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^ (h >> 32)
}

/// A slot of a pool, owned: what a [`Ticket`] holds while its task waits
/// to run.
struct SlotOf {
    pool: Arc<PoolInner>,
    index: usize,
}

impl SlotOf {
    fn slot(&self) -> &Slot {
        &self.pool.slots[self.index]
    }
}

impl AsRef<Queue> for SlotOf {
    fn as_ref(&self) -> &Queue {
        &self.slot().queue
    }
}

impl Connections for Pool {
    type Con = ConnectionManager;

    fn pick(&self, key: &str) -> ConnectionManager {
        ConnectionManager::clone(&self.0.slots[self.slot_of(key)].manager.load())
    }

    /// Queued on a slot's [`Queue`] at once (the future only waits for the
    /// answer, so a claim's future does not carry the command): the call
    /// that finds no task due to take the queue spawns the one that sends
    /// the batch (see [`batch`]).
    ///
    /// Behind Sentinel, an answer that says the master may have moved (no
    /// answer, or `READONLY`) asks the Sentinels again ([`follow_master`]).
    fn query(
        &self,
        key: &str,
        cmd: Cmd,
        durable: bool,
    ) -> impl Future<Output = RedisResult<Value>> + Send {
        let index = self.slot_of(key);
        let (answer, first) = self.0.slots[index].queue.push(cmd, durable);
        if first {
            let ticket = Ticket::new(SlotOf {
                pool: Arc::clone(&self.0),
                index,
            });
            tokio::spawn(batch::flush(
                ticket,
                |s: &SlotOf| ConnectionManager::clone(&s.slot().manager.load()),
                |s: &SlotOf, took| s.pool.report_late(took),
                self.0.replicas,
            ));
        }
        // Only a Sentinel's pool is held by the answer (one Redis's
        // futures carry a `None`, and no reference count is touched).
        let watched = self.0.sentinel.is_some().then(|| Arc::clone(&self.0));
        answer.answer().map(move |answer| {
            if let Some(pool) = watched
                && sentinel::may_have_moved(&answer)
            {
                follow_master(&pool);
            }
            answer
        })
    }

    /// Replaces every connection with a fresh one (made on first use). A
    /// multiplexed connection whose replies stopped coming (a half-open TCP
    /// connection, a partition that swallowed packets) never recovers by
    /// itself: every later reply would be matched to an abandoned request.
    fn reconnect(&self) {
        let p = &*self.0;
        replace_connections(p, &p.client.load());
        metrics::counter!("norepeat_store_reconnects_total").increment(1);
        tracing::warn!("replaced the Redis connections after repeated timeouts");
        follow_master(&self.0);
    }

    fn report_late_answers(&self, to: LateAnswers) {
        let mut late = self.0.late.lock().unwrap_or_else(PoisonError::into_inner);
        late.retain(LateAnswers::is_live);
        late.push(to);
    }
}

/// Replaces every connection of `pool` with a fresh one to `client`'s
/// server (made on first use); the old ones close when their last call
/// is answered.
fn replace_connections(pool: &PoolInner, client: &redis::Client) {
    for slot in &pool.slots {
        match ConnectionManager::new_lazy_with_config(client.clone(), manager_config()) {
            Ok(fresh) => slot.manager.store(Arc::new(fresh)),
            Err(e) => tracing::warn!(error = %e, "could not replace a Redis connection"),
        }
    }
}

/// Behind Sentinel, asks the Sentinels where the master is, in a task of
/// its own (one at a time, at most one lookup per
/// [`LOOKUP_GAP`](sentinel::LOOKUP_GAP)), and when it moved, points the
/// pool there: every connection replaced, the old master's dropped. Does
/// nothing for a Redis named by its address, or outside a runtime (the
/// next failed call asks again).
fn follow_master(pool: &Arc<PoolInner>) {
    let Some(discovery) = &pool.sentinel else {
        return;
    };
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if !discovery.ask() {
        return;
    }
    let pool = Arc::clone(pool);
    runtime.spawn(async move {
        let Some(discovery) = pool.sentinel.clone() else {
            return;
        };
        while discovery.again() {
            match discovery.master().await {
                Ok(client) => {
                    let old = pool.client.load();
                    if client.get_connection_info().addr() != old.get_connection_info().addr() {
                        tracing::warn!(
                            master = discovery.name(),
                            from = %old.get_connection_info().addr(),
                            to = %client.get_connection_info().addr(),
                            "the Sentinels name a new master: connections moved there"
                        );
                        replace_connections(&pool, &client);
                        pool.client.store(Arc::new(client));
                        metrics::counter!("norepeat_store_master_changes_total").increment(1);
                    }
                }
                Err(e) => tracing::warn!(
                    master = discovery.name(),
                    error = %e,
                    "the Sentinels named no master (a failover under way?)"
                ),
            }
            tokio::time::sleep(sentinel::LOOKUP_GAP).await;
        }
    });
}

impl_store!(RedisStore, "redis");
