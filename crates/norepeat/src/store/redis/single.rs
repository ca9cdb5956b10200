//! One Redis server, over a few multiplexed connections.

use super::batch::{self, Queue, Ticket};
use super::{Backend, Connections, Scripts, map_err};
use crate::store::{LateAnswers, StoreError, redact_url};
use arc_swap::ArcSwap;
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
        let client = open(url)?;
        let mut managers = Vec::new();
        for _ in 0..connections.max(1) {
            managers.push(
                ConnectionManager::new_with_config(client.clone(), manager_config())
                    .await
                    .map_err(|e| at(url, map_err(e)))?,
            );
        }
        Ok(Self::with_pool(client, managers))
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
    /// [`StoreError::InvalidUrl`] when the URL is not a Redis URL.
    pub fn connect_lazy_with(url: &str, connections: usize) -> Result<Self, StoreError> {
        let client = open(url)?;
        let managers = (0..connections.max(1))
            .map(|_| ConnectionManager::new_lazy_with_config(client.clone(), manager_config()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| at(url, map_err(e)))?;
        Ok(Self::with_pool(client, managers))
    }

    fn with_pool(client: redis::Client, managers: Vec<ConnectionManager>) -> Self {
        Self(Backend {
            con: Pool(Arc::new(PoolInner {
                client,
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

/// The client of `url`, or why the URL is no Redis URL (with its password
/// replaced by `***`, and how a good one looks).
fn open(url: &str) -> Result<redis::Client, StoreError> {
    redis::Client::open(url).map_err(|e| {
        StoreError::InvalidUrl(format!(
            "{:?} ({e}); a Redis URL looks like redis://[[user]:password@]host:port[/db] or rediss:// for TLS",
            redact_url(url)
        ))
    })
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
    client: redis::Client,
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
    fn query(&self, key: &str, cmd: Cmd) -> impl Future<Output = RedisResult<Value>> + Send {
        let index = self.slot_of(key);
        let (answer, first) = self.0.slots[index].queue.push(cmd);
        if first {
            let ticket = Ticket::new(SlotOf {
                pool: Arc::clone(&self.0),
                index,
            });
            tokio::spawn(batch::flush(
                ticket,
                |s: &SlotOf| ConnectionManager::clone(&s.slot().manager.load()),
                |s: &SlotOf, took| s.pool.report_late(took),
            ));
        }
        answer.answer()
    }

    /// Replaces every connection with a fresh one (made on first use). A
    /// multiplexed connection whose replies stopped coming (a half-open TCP
    /// connection, a partition that swallowed packets) never recovers by
    /// itself: every later reply would be matched to an abandoned request.
    fn reconnect(&self) {
        let p = &*self.0;
        for slot in &p.slots {
            match ConnectionManager::new_lazy_with_config(p.client.clone(), manager_config()) {
                Ok(fresh) => slot.manager.store(Arc::new(fresh)),
                Err(e) => tracing::warn!(error = %e, "could not replace a Redis connection"),
            }
        }
        metrics::counter!("norepeat_store_reconnects_total").increment(1);
        tracing::warn!("replaced the Redis connections after repeated timeouts");
    }

    fn report_late_answers(&self, to: LateAnswers) {
        let mut late = self.0.late.lock().unwrap_or_else(PoisonError::into_inner);
        late.retain(LateAnswers::is_live);
        late.push(to);
    }
}

impl_store!(RedisStore, "redis");
