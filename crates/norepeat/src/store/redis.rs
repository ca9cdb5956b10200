//! Redis and Redis Cluster backends.

use super::{KeyOp, KeyReply, KeyValueStore, RateDecision, RateOp, RateStore, StoreError, ttl_ms};
use bytes::Bytes;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{RedisError, Script};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// The Lua scripts, each hashed once; `Script` runs them by EVALSHA and loads
/// them again when a (restarted or newly promoted) server answers NOSCRIPT.
struct Scripts {
    release: Script,
    renew: Script,
    replace: Script,
    fixed_window: Script,
    sliding_window: Script,
    gcra: Script,
}

impl Scripts {
    fn new() -> Self {
        Self {
            release: Script::new(include_str!("lua/release.lua")),
            renew: Script::new(include_str!("lua/renew.lua")),
            replace: Script::new(include_str!("lua/replace.lua")),
            fixed_window: Script::new(include_str!("lua/fixed_window.lua")),
            sliding_window: Script::new(include_str!("lua/sliding_window.lua")),
            gcra: Script::new(include_str!("lua/gcra.lua")),
        }
    }
}

fn map_err(e: RedisError) -> StoreError {
    if e.is_timeout() {
        StoreError::Timeout(Duration::ZERO)
    } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        StoreError::Connection(e.to_string())
    } else if is_cluster_reforming(&e) {
        // The cluster client follows these itself (redirects, slot refresh,
        // waits); one still here outlived its retries: the slot has no
        // reachable master right now. An outage, not an answer.
        StoreError::Connection(format!("cluster re-forming: {e}"))
    } else if e.code().is_some() {
        StoreError::Server(e.to_string())
    } else if e.is_cluster_error() {
        StoreError::Connection(e.to_string())
    } else {
        StoreError::Protocol(e.to_string())
    }
}

/// A redirection or a cluster in transition (failover, resharding): `MOVED`,
/// `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`. `READONLY` (a write that
/// reached a demoted master) stays a server answer, as on one Redis.
fn is_cluster_reforming(e: &RedisError) -> bool {
    matches!(
        e.code(),
        Some("MOVED" | "ASK" | "TRYAGAIN" | "CLUSTERDOWN" | "MASTERDOWN")
    )
}

fn decision(v: (i64, i64, i64)) -> RateDecision {
    RateDecision {
        allowed: v.0 == 1,
        remaining: u64::try_from(v.1).unwrap_or(0),
        reset: Duration::from_micros(u64::try_from(v.2).unwrap_or(0)),
    }
}

/// The operations, shared by the single-node and cluster stores.
#[derive(Clone)]
struct Backend<C> {
    con: C,
    scripts: Arc<Scripts>,
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Backend<C> {
    async fn put_if_absent(
        &self,
        key: &str,
        value: &[u8],
        ttl: Duration,
    ) -> Result<Option<Bytes>, StoreError> {
        let mut con = self.con.clone();
        let old: Option<Vec<u8>> = redis::cmd("SET")
            .arg(key)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms(ttl))
            .arg("GET")
            .query_async(&mut con)
            .await
            .map_err(map_err)?;
        Ok(old.map(Bytes::from))
    }

    async fn eval_bool(
        &self,
        script: &Script,
        key: &str,
        args: &[&[u8]],
    ) -> Result<bool, StoreError> {
        let mut con = self.con.clone();
        let mut inv = script.key(key);
        for a in args {
            inv.arg(*a);
        }
        let n: i64 = inv.invoke_async(&mut con).await.map_err(map_err)?;
        Ok(n == 1)
    }

    async fn eval_rate(
        &self,
        script: &Script,
        key: &str,
        a: u64,
        b: u64,
    ) -> Result<RateDecision, StoreError> {
        let mut con = self.con.clone();
        let v: (i64, i64, i64) = script
            .key(key)
            .arg(a)
            .arg(b)
            .invoke_async(&mut con)
            .await
            .map_err(map_err)?;
        Ok(decision(v))
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Backend<C> {
    async fn execute(&self, op: KeyOp<'_>) -> Result<KeyReply, StoreError> {
        match op {
            KeyOp::PutIfAbsent { key, value, ttl } => self
                .put_if_absent(key, value, ttl)
                .await
                .map(KeyReply::Held),
            KeyOp::DeleteIfEquals { key, expected } => self
                .eval_bool(&self.scripts.release, key, &[expected])
                .await
                .map(KeyReply::Changed),
            KeyOp::ExpireIfEquals { key, expected, ttl } => {
                let ms = ttl_ms(ttl).to_string();
                self.eval_bool(&self.scripts.renew, key, &[expected, ms.as_bytes()])
                    .await
                    .map(KeyReply::Changed)
            }
            KeyOp::ReplaceIfEquals {
                key,
                expected,
                value,
                ttl,
            } => {
                let ms = ttl_ms(ttl).to_string();
                self.eval_bool(
                    &self.scripts.replace,
                    key,
                    &[expected, value, ms.as_bytes()],
                )
                .await
                .map(KeyReply::Changed)
            }
        }
    }

    async fn rate(&self, op: RateOp<'_>) -> Result<RateDecision, StoreError> {
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1);
        match op {
            RateOp::FixedWindow { key, limit, window } => {
                self.eval_rate(&self.scripts.fixed_window, key, limit, ttl_ms(window))
                    .await
            }
            RateOp::SlidingWindow { key, limit, window } => {
                self.eval_rate(&self.scripts.sliding_window, key, limit, micros(window))
                    .await
            }
            RateOp::Gcra {
                key,
                emission,
                burst,
            } => {
                self.eval_rate(&self.scripts.gcra, key, micros(emission), burst.max(1))
                    .await
            }
        }
    }
}

/// The store traits of a Redis store type: its [`Backend`] does the work.
macro_rules! impl_store {
    ($ty:ty, $kind:literal) => {
        impl KeyValueStore for $ty {
            fn execute(
                &self,
                op: KeyOp<'_>,
            ) -> impl std::future::Future<Output = Result<KeyReply, StoreError>> + Send {
                self.0.execute(op)
            }

            fn kind(&self) -> &'static str {
                $kind
            }

            fn reconnect(&self) {
                self.0.con.reconnect();
            }
        }

        impl RateStore for $ty {
            fn rate(
                &self,
                op: RateOp<'_>,
            ) -> impl std::future::Future<Output = Result<RateDecision, StoreError>> + Send {
                self.0.rate(op)
            }
        }
    };
}

/// One Redis server, through a [`ConnectionManager`] that multiplexes every
/// call over one connection and reconnects after a failure.
///
/// Cheap to clone; clones share the connection.
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
            .field("connections", &self.0.con.managers.len())
            .finish()
    }
}

/// How many multiplexed connections a [`RedisStore`] spreads its calls over
/// by default. One connection serialises every write and read through one
/// socket and one task; two let the client use both cores of a small
/// machine (see BENCHMARKS.md).
pub const DEFAULT_CONNECTIONS: usize = 2;

impl RedisStore {
    /// Connects to the Redis at `url` (`redis://host:port/db`) with
    /// [`DEFAULT_CONNECTIONS`] multiplexed connections.
    ///
    /// # Errors
    /// When the URL is invalid or the first connection fails.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, DEFAULT_CONNECTIONS).await
    }

    /// Connects with `connections` multiplexed connections (at least one),
    /// used in turn.
    ///
    /// # Errors
    /// When the URL is invalid or the first connection fails.
    pub async fn connect_with(url: &str, connections: usize) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(map_err)?;
        let mut managers = Vec::new();
        for _ in 0..connections.max(1) {
            managers.push(
                ConnectionManager::new_with_config(client.clone(), manager_config())
                    .await
                    .map_err(map_err)?,
            );
        }
        Ok(Self::with_pool(client, managers))
    }

    /// Like [`connect`](Self::connect), but connects on first use: a store
    /// for a process that must start while Redis is down (its calls fail,
    /// and the guards' failure policy applies, until Redis answers).
    ///
    /// # Errors
    /// When the URL is invalid.
    pub fn connect_lazy(url: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(map_err)?;
        let managers = (0..DEFAULT_CONNECTIONS)
            .map(|_| ConnectionManager::new_lazy_with_config(client.clone(), manager_config()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(map_err)?;
        Ok(Self::with_pool(client, managers))
    }

    fn with_pool(client: redis::Client, managers: Vec<ConnectionManager>) -> Self {
        Self(Backend {
            con: Pool {
                client,
                managers: managers
                    .into_iter()
                    .map(RwLock::new)
                    .collect::<Vec<_>>()
                    .into(),
                next: Arc::new(AtomicUsize::new(0)),
            },
            scripts: Arc::new(Scripts::new()),
        })
    }
}

fn manager_config() -> redis::aio::ConnectionManagerConfig {
    redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500))
}

/// A few connection managers used in turn. Each call clones one (an `Arc`)
/// under a read lock that is never held across an await.
#[derive(Clone)]
struct Pool {
    client: redis::Client,
    managers: Arc<[RwLock<ConnectionManager>]>,
    next: Arc<AtomicUsize>,
}

impl Pool {
    fn pick(&self) -> ConnectionManager {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.managers.len();
        self.managers[i]
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// Connections that can be replaced when their replies stop coming.
trait Reconnect {
    fn reconnect(&self);
}

impl Reconnect for ClusterConnection {
    /// The cluster client replaces broken node connections itself.
    fn reconnect(&self) {}
}

impl Reconnect for Pool {
    /// Replaces every connection with a fresh one (made on first use). A
    /// multiplexed connection whose replies stopped coming (a half-open TCP
    /// connection, a partition that swallowed packets) never recovers by
    /// itself: every later reply would be matched to an abandoned request.
    fn reconnect(&self) {
        for slot in self.managers.iter() {
            match ConnectionManager::new_lazy_with_config(self.client.clone(), manager_config()) {
                Ok(fresh) => {
                    *slot
                        .write()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = fresh;
                }
                Err(e) => tracing::warn!(error = %e, "could not replace a Redis connection"),
            }
        }
        metrics::counter!("norepeat_store_reconnects_total").increment(1);
        tracing::warn!("replaced the Redis connections after repeated timeouts");
    }
}

impl ConnectionLike for Pool {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        let mut con = self.pick();
        Box::pin(async move { con.req_packed_command(cmd).await })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        let mut con = self.pick();
        Box::pin(async move { con.req_packed_commands(cmd, offset, count).await })
    }

    fn get_db(&self) -> i64 {
        self.client.get_connection_info().redis_settings().db()
    }
}

impl_store!(RedisStore, "redis");

/// A Redis Cluster. Every operation (each command, each Lua script)
/// touches exactly one key, so it runs in that key's slot and needs no hash
/// tag; redirections (MOVED, ASK) and failovers
/// are followed by the cluster client, and scripts are loaded again on a new
/// master that answers NOSCRIPT.
///
/// What the client (redis-rs cluster-async) does during a failover, and how
/// it is configured here:
/// - `MOVED`/`ASK`: followed at once (a `MOVED` also refreshes the slot map).
/// - `READONLY` (a write on a master demoted to replica): slot map refreshed,
///   command retried on the new master.
/// - `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`: retried after a short backoff
///   (10 ms rising to 500 ms here; the client's default waits 1.28 s before
///   every such retry, longer than any guard's budget).
/// - a refused or dropped connection: reconnected, retried, and the slot map
///   refreshed.
///
/// At most 6 retries, and 2 s per call in all (connecting: 1 s). Put the
/// store behind [`Resilient`](super::Resilient) for a guard's much
/// shorter budget and a breaker, and behind
/// [`Fallback`](super::Fallback) for fail-open routes: while a
/// master's slots have no master (a few seconds, set by
/// `cluster-node-timeout`), calls on them fail and the route's policy
/// applies; calls on other slots are unaffected.
///
/// `NOSCRIPT`: Redis does not replicate `SCRIPT LOAD` (checked on 7.0), so a
/// promoted replica may lack the scripts; the first call there loads them
/// (`SCRIPT LOAD` on every node) and runs again.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), norepeat::store::StoreError> {
/// let store = norepeat::store::ClusterStore::connect(&[
///     "redis://127.0.0.1:7000", "redis://127.0.0.1:7001", "redis://127.0.0.1:7002",
/// ]).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ClusterStore(Backend<ClusterConnection>);

impl std::fmt::Debug for ClusterStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterStore")
    }
}

impl ClusterStore {
    /// Connects to the cluster that `nodes` (`redis://host:port` each) belong to.
    ///
    /// # Errors
    /// When no node can be reached or a URL is invalid.
    pub async fn connect<S: AsRef<str>>(nodes: &[S]) -> Result<Self, StoreError> {
        let nodes: Vec<&str> = nodes.iter().map(AsRef::as_ref).collect();
        let client = redis::cluster::ClusterClientBuilder::new(nodes)
            .connection_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(2))
            .retries(6)
            .min_retry_wait(10)
            .max_retry_wait(500)
            .retry_wait_formula(20, 2)
            .build()
            .map_err(map_err)?;
        let con = client.get_async_connection().await.map_err(map_err)?;
        Ok(Self(Backend {
            con,
            scripts: Arc::new(Scripts::new()),
        }))
    }
}

impl_store!(ClusterStore, "cluster");
