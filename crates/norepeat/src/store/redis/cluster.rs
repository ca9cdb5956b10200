// Over 400 lines on purpose: one cluster client: the slot map, the batches per master and their redirections, which share its state and read best in order.
//! Redis Cluster, batched per master node.
//!
//! # Why the store keeps its own slot map
//!
//! The calls that arrive together should leave together, as on one Redis
//! (see [`batch`](super::batch)): one pipeline per master node instead of
//! one write per call. redis-rs (1.8) offers no way to do that safely:
//! - a [`redis::Pipeline`] on a cluster connection must have every key in
//!   one slot (it fails with `CROSSSLOT` before sending anything);
//! - `ClusterConnection::route_pipeline` sends a pipeline to one node, but
//!   when any of its answers is a redirection (`MOVED`, `ASK`) or a slot in
//!   transition (`TRYAGAIN`, `CLUSTERDOWN`) the client sends the *whole*
//!   pipeline again to the new node. The commands that had run then run
//!   twice, and a `SET key v NX PX ttl GET` sent twice answers its second
//!   time with the value it wrote itself: the first caller of a key would
//!   be told the key is taken. Its slot map is not public either.
//!
//! So the store keeps its own map of slot → master (from `CLUSTER SLOTS`)
//! and one [`ConnectionManager`] and one [`Queue`] per master. A call
//! computes its key's slot (CRC16, with the `{hash tag}` rule), queues its
//! command on that master's queue, and the queue leaves as one pipeline
//! with `ignore_errors`: every command keeps its own answer, a redirection
//! included. Only the commands answered `MOVED`, `ASK`, `TRYAGAIN` or
//! `CLUSTERDOWN` (none of which ran) are sent again, each alone: a `MOVED`
//! one to the master it names, an `ASK` one there right after `ASKING`, in
//! one pipeline (redis-rs sends `ASKING` as a request of its own, and
//! under concurrency those interleave: checked, every one of 60 claims
//! redirected together timed out), and the rest (a slot in transition, a
//! second redirection) through the redis-rs cluster connection, which
//! waits and follows. A `MOVED`, or a master that does not answer,
//! refreshes the store's map
//! (in the background, at most one refresh per [`REFRESH_GAP`]); a slot
//! the map does not know (no master, an endpoint it cannot name) is sent
//! alone through the cluster connection too.
//!
//! A batch that fails as a whole (the node died, the response timeout) may
//! have run on the node: its commands are not sent again, and their callers
//! get the error, as on one Redis. A caller that gives up before its batch
//! leaves sends nothing.
//!
//! The commands on one key keep their order while the map does not change
//! (one queue per master, batches in the order taken). While a slot moves,
//! a command sent again alone may be overtaken by a later one on the same
//! key only if its caller sent the later one without awaiting the first;
//! the guards await every call.
//!
//! # Why this file is long
//!
//! It is the one place that knows the cluster's shape, and its parts share
//! that private state: the connection to the cluster and the store's type
//! (`connect`), the slot map and its refresh (`SlotMap`, `Inner::refresh`,
//! at most one at a time), a node's connection and queue (`Node`, made and
//! replaced as the map changes), and the send path (`Nodes::query`: one
//! batch per master, the redirected commands sent again one by one, a late
//! answer reported). Split into files, each would reach into the others'
//! fields; the batching itself, shared with one Redis, is in
//! [`batch`](super::batch), and the commands in [`super`]. The unit tests
//! at the end check the slot function; the behaviour is tested against
//! real clusters of six `redis-server`s (`tests/cluster.rs`,
//! `tests/cluster_batching.rs`, which moves slots while claims run).

use super::batch::{self, Queue, Redirected, Ticket};
use super::single::{at, manager_config};
use super::url::{self, Replicas};
use super::{Backend, Connections, Scripts, map_err};
use crate::store::{LateAnswers, StoreError, redact_url};
use arc_swap::ArcSwap;
use futures_util::future::BoxFuture;
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::{
    Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo, RedisError, RedisResult,
    Value,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// A Redis Cluster. Every operation (each command, each Lua script)
/// touches exactly one key, so it runs in that key's slot and needs no hash
/// tag. Calls that arrive together leave as one pipeline per master node
/// (see the module docs for how, and why redirections are still answered
/// right); redirections (MOVED, ASK) and failovers are followed, and
/// scripts are loaded again on a new master that answers NOSCRIPT.
///
/// What the cluster client (redis-rs cluster-async), through which the
/// commands answered with a redirection are sent again, does during a
/// failover, and how it is configured here:
/// - `MOVED`/`ASK`: followed at once (a `MOVED` also refreshes the slot map).
/// - `READONLY` (a write on a master demoted to replica): slot map refreshed,
///   command retried on the new master.
/// - `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`: retried after a short backoff
///   (10 ms rising to 500 ms here; the client's default waits 1.28 s before
///   every such retry, longer than any guard's budget).
/// - a refused or dropped connection: reconnected, retried, and the slot map
///   refreshed.
///
/// At most 6 retries, and 2 s per call in all (connecting: 1 s). A batch
/// sent straight to a master has the response timeout of a
/// [`RedisStore`](crate::store::RedisStore)'s connection (2 s); when
/// its node is gone its calls fail, and the store's slot map is refreshed
/// until the slots have a new master. Put the store behind
/// [`Resilient`](crate::store::Resilient) for a guard's much shorter budget
/// and a breaker, and behind [`Fallback`](crate::store::Fallback) for
/// fail-open routes: while a master's slots have no master (a few seconds,
/// set by `cluster-node-timeout`), calls on them fail and the route's
/// policy applies; calls on other slots are unaffected.
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
pub struct ClusterStore(Backend<Nodes>);

impl std::fmt::Debug for ClusterStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterStore")
            .field("masters", &self.0.con.0.map.load().nodes.len())
            .finish()
    }
}

impl ClusterStore {
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

    /// Connects to the cluster that `nodes` (`redis://host:port` each) belong to.
    ///
    /// A node URL may end with `?replicas=N[&replicas_timeout=T]` (as a
    /// [`RedisStore`](crate::store::RedisStore)'s: each claim and
    /// completion waits for `N` replicas of its master, `WAIT N T` in its
    /// batch); every URL that says so must say the same.
    ///
    /// # Errors
    /// When no node can be reached or a URL is invalid.
    pub async fn connect<S: AsRef<str>>(nodes: &[S]) -> Result<Self, StoreError> {
        let given: Vec<&str> = nodes.iter().map(AsRef::as_ref).collect();
        let mut replicas = None;
        let mut nodes = Vec::with_capacity(given.len());
        for node in &given {
            let (rest, asked) = url::split_settings(node, &[])
                .map_err(|e| StoreError::InvalidUrl(format!("{:?}: {e}", redact_url(node))))?;
            if asked.is_some() && replicas.is_some_and(|r| Some(r) != asked) {
                return Err(StoreError::InvalidUrl(format!(
                    "{:?}: the nodes ask for different replicas",
                    redact_url(node)
                )));
            }
            replicas = replicas.or(asked);
            nodes.push(rest.into_owned());
        }
        let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
        let shown = nodes
            .iter()
            .map(|n| redact_url(n))
            .collect::<Vec<_>>()
            .join(",");
        let invalid = |e: redis::RedisError| {
            StoreError::InvalidUrl(format!(
                "{shown:?} ({e}); a node's URL looks like redis://[[user]:password@]host:port"
            ))
        };
        let client = redis::cluster::ClusterClientBuilder::new(nodes.clone())
            .connection_timeout(Duration::from_secs(1))
            .response_timeout(super::single::RESPONSE_TIMEOUT)
            .retries(6)
            .min_retry_wait(10)
            .max_retry_wait(500)
            .retry_wait_formula(20, 2)
            .build()
            .map_err(invalid)?;
        // The settings (credentials, TLS) every node connection copies; the
        // builder accepted the URLs, so there is a first one.
        let info = nodes
            .first()
            .map(|n| n.into_connection_info())
            .transpose()
            .map_err(invalid)?
            .ok_or_else(|| StoreError::InvalidUrl("no node URL given".to_owned()))?;
        let cluster = client
            .get_async_connection()
            .await
            .map_err(|e| at(&shown, map_err(e)))?;
        let inner = Arc::new(Inner {
            cluster,
            info,
            replicas,
            map: ArcSwap::from_pointee(SlotMap::empty()),
            refreshing: AtomicBool::new(false),
            stale: AtomicBool::new(false),
            late: Mutex::new(Vec::new()),
        });
        // Without a map every call goes alone through the cluster
        // connection (and asks for a map): slower, not wrong.
        if let Err(e) = inner.refresh().await {
            tracing::warn!(error = %e, "could not read the cluster's slot map; calls go unbatched until it is read");
        }
        Ok(Self(Backend {
            con: Nodes(inner),
            scripts: Arc::new(Scripts::new()),
        }))
    }
}

/// The fewest milliseconds between two refreshes of the slot map: a storm
/// of redirections (every call on a moved slot) asks for one refresh.
const REFRESH_GAP: Duration = Duration::from_millis(100);

/// The slots of a cluster.
const SLOTS: usize = 16384;

/// No known master: the slot's calls go alone through the cluster
/// connection.
const NO_NODE: u16 = u16::MAX;

/// The masters of the cluster, each with its connection and queue, and
/// the cluster client for everything a master did not answer itself.
/// Cloning it (every clone of the store) is one `Arc`.
#[derive(Clone)]
struct Nodes(Arc<Inner>);

struct Inner {
    /// Sends what the map cannot (unknown slots, redirected commands) and
    /// loads scripts; asked for the slot map.
    cluster: ClusterConnection,
    /// The first node's connection settings, the address aside.
    info: ConnectionInfo,
    /// The replicas each claim and completion waits for.
    replicas: Option<Replicas>,
    map: ArcSwap<SlotMap>,
    /// A refresh task is running.
    refreshing: AtomicBool,
    /// A refresh was asked for since the last one began.
    stale: AtomicBool,
    /// Where the answers that came after their callers gave up are
    /// reported; read only when such an answer comes.
    late: Mutex<Vec<LateAnswers>>,
}

/// Which master serves each slot.
struct SlotMap {
    /// An index into `nodes` per slot, or [`NO_NODE`].
    owner: Box<[u16]>,
    nodes: Vec<Arc<Node>>,
}

impl SlotMap {
    fn empty() -> Self {
        Self {
            owner: vec![NO_NODE; SLOTS].into_boxed_slice(),
            nodes: Vec::new(),
        }
    }

    fn node(&self, slot: u16) -> Option<&Arc<Node>> {
        let index = *self.owner.get(usize::from(slot))?;
        self.nodes.get(usize::from(index))
    }
}

/// One master: its connection and the calls waiting for its next write.
/// A refresh keeps the masters it finds again (their queues keep the order
/// of a key's commands).
struct Node {
    host: String,
    port: u16,
    client: redis::Client,
    /// Replaced whole by [`Connections::reconnect`].
    manager: ArcSwap<ConnectionManager>,
    queue: Queue,
}

impl Inner {
    /// Reads `CLUSTER SLOTS` and replaces the map.
    async fn refresh(&self) -> RedisResult<()> {
        let mut con = self.cluster.clone();
        let answer: Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut con)
            .await?;
        let old = self.map.load();
        let mut map = SlotMap::empty();
        for (from, to, host, port) in slot_ranges(answer)? {
            let known = map
                .nodes
                .iter()
                .position(|n| n.host == host && n.port == port);
            let index = match known {
                Some(index) => index,
                None => {
                    let reused = old
                        .nodes
                        .iter()
                        .find(|n| n.host == host && n.port == port)
                        .map(Arc::clone);
                    let Some(node) = reused.or_else(|| self.node(host, port)) else {
                        continue;
                    };
                    map.nodes.push(node);
                    map.nodes.len() - 1
                }
            };
            // A cluster has far fewer than 65535 masters.
            let index = u16::try_from(index).unwrap_or(NO_NODE);
            for slot in from..=to.min(SLOTS as u16 - 1) {
                map.owner[usize::from(slot)] = index;
            }
        }
        self.map.store(Arc::new(map));
        Ok(())
    }

    /// A new master's connection (made on first use), with the first
    /// node's settings; `None` when the address cannot take them (a Unix
    /// socket), and its slots go through the cluster connection.
    fn node(&self, host: String, port: u16) -> Option<Arc<Node>> {
        let addr = match self.info.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host: host.clone(),
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host.clone(), port),
        };
        let made = redis::Client::open(self.info.clone().set_addr(addr)).and_then(|client| {
            let manager =
                ConnectionManager::new_lazy_with_config(client.clone(), manager_config())?;
            Ok(Node {
                host,
                port,
                client,
                manager: ArcSwap::from_pointee(manager),
                queue: Queue::default(),
            })
        });
        match made {
            Ok(node) => Some(Arc::new(node)),
            Err(e) => {
                tracing::warn!(error = %e, "cannot connect to a cluster master; its slots go unbatched");
                None
            }
        }
    }

    /// Asks for a refresh of the map, done by one background task at a
    /// time, at most one per [`REFRESH_GAP`]; a failed one is tried again
    /// at the next request.
    fn refresh_soon(self: &Arc<Self>) {
        // SeqCst on both flags, both sides: each side writes one flag and
        // then reads the other, which weaker orderings (and x86's store
        // buffer) let both sides miss, losing the refresh.
        self.stale.store(true, Ordering::SeqCst);
        // Outside a runtime (a `reconnect` from a plain thread) the next
        // call in one asks again.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.refreshing.swap(true, Ordering::SeqCst) {
            return;
        }
        let inner = Arc::clone(self);
        runtime.spawn(async move {
            loop {
                while inner.stale.swap(false, Ordering::SeqCst) {
                    if let Err(e) = inner.refresh().await {
                        tracing::warn!(error = %e, "could not refresh the cluster's slot map");
                    }
                    tokio::time::sleep(REFRESH_GAP).await;
                }
                inner.refreshing.store(false, Ordering::SeqCst);
                // A request made between the last check and the store
                // above found the task still running: take it on.
                if !inner.stale.load(Ordering::SeqCst)
                    || inner.refreshing.swap(true, Ordering::SeqCst)
                {
                    break;
                }
            }
        });
    }

    /// Sends a command a master did not run where its answer says: a
    /// `MOVED` one to the master named, an `ASK` one there too, right
    /// after `ASKING`, in one pipeline (redis-rs's cluster client sends
    /// `ASKING` as a request of its own, and concurrent ones interleave on
    /// its shared connection: each command then finds the flag spent by
    /// another and is redirected until it times out). A slot in transition
    /// (`TRYAGAIN`, `CLUSTERDOWN`), or a second redirection, goes to the
    /// cluster client, which waits and follows.
    ///
    /// `durable`: the command's slot, when it is a write its master's
    /// replicas must have; `WAIT` follows it in the same pipeline.
    async fn redirect(
        &self,
        cmd: Cmd,
        error: RedisError,
        durable: Option<u16>,
    ) -> RedisResult<Value> {
        let asking = error.code() == Some("ASK");
        let target = error.redirect_node().and_then(|(addr, _slot)| {
            let (host, port) = addr.rsplit_once(':')?;
            Some((host.to_owned(), port.parse::<u16>().ok()?))
        });
        let Some(node) = target.and_then(|(host, port)| self.node_at(host, port)) else {
            return self.alone(cmd, durable).await;
        };
        let mut con = ConnectionManager::clone(&node.manager.load());
        let wait = self.replicas.filter(|_| durable.is_some());
        let answer = if asking || wait.is_some() {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            if asking {
                pipe.add_command(redis::cmd("ASKING"));
            }
            pipe.add_command(cmd.clone());
            if let Some(r) = wait {
                pipe.add_command(batch::wait(r));
            }
            let expected = 1 + usize::from(asking) + usize::from(wait.is_some());
            pipe.query_async::<Vec<Value>>(&mut con)
                .await
                .and_then(|answers| answered(answers, expected, usize::from(asking), wait))
        } else {
            cmd.query_async::<Value>(&mut con).await
        };
        match answer {
            Err(e) if matches!(e.code(), Some("MOVED" | "ASK" | "TRYAGAIN" | "CLUSTERDOWN")) => {
                self.alone(cmd, durable).await
            }
            answer => answer,
        }
    }

    /// The master at `host:port`: the map's, or a connection for this call
    /// alone (a master the map does not know yet).
    fn node_at(&self, host: String, port: u16) -> Option<Arc<Node>> {
        let known = self
            .map
            .load()
            .nodes
            .iter()
            .find(|n| n.host == host && n.port == port)
            .map(Arc::clone);
        known.or_else(|| self.node(host, port))
    }

    /// Sends `cmd` alone through the cluster client, which follows
    /// redirections and waits out slots in transition. `durable`: its
    /// slot, when its master's replicas must have it: then `cmd` and
    /// `WAIT` go as one pipeline to that slot's master (the client sends
    /// a redirected pipeline again whole: the `WAIT` again, and the
    /// command, which a redirection says did not run).
    async fn alone(&self, cmd: Cmd, durable: Option<u16>) -> RedisResult<Value> {
        let mut con = self.cluster.clone();
        let (Some(slot), Some(r)) = (durable, self.replicas) else {
            return cmd.query_async(&mut con).await;
        };
        let mut pipe = redis::pipe();
        pipe.add_command(cmd).add_command(batch::wait(r));
        let route = redis::cluster_routing::SingleNodeRoutingInfo::SpecificNode(
            redis::cluster_routing::Route::new(slot, redis::cluster_routing::SlotAddr::Master),
        );
        let answers = con.route_pipeline(pipe, 0, 2, route).await?;
        answered(answers, 2, 0, Some(r))
    }

    /// Reports one late answer to every live target, forgetting the gone.
    fn report_late(&self, took: Duration) {
        self.late
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|to| to.report(took));
    }
}

/// The answer of the command at `at` of a pipeline of `expected`
/// answers, the last of which is `WAIT`'s when `wait` is asked: an error
/// when fewer replicas than asked acknowledged it.
fn answered(
    mut answers: Vec<Value>,
    expected: usize,
    at: usize,
    wait: Option<Replicas>,
) -> RedisResult<Value> {
    if answers.len() != expected {
        return Err(RedisError::from((
            ErrorKind::Parse,
            "a redirected command's pipeline got the wrong number of answers",
            format!("{} answers to {expected} commands", answers.len()),
        )));
    }
    let acked = wait.map(|_| answers.pop().map(Value::extract_error));
    let answer = answers.swap_remove(at).extract_error()?;
    match wait
        .zip(acked)
        .and_then(|(r, acked)| batch::short_of(r, acked))
    {
        Some(short) if batch::wrote(&answer) => Err(short),
        _ => Ok(answer),
    }
}

/// `(first slot, last slot, master host, master port)` per range of a
/// `CLUSTER SLOTS` answer. A range whose master has no endpoint to name
/// (an empty host or `?`) is left out: its slots go through the cluster
/// connection.
fn slot_ranges(answer: Value) -> RedisResult<Vec<(u16, u16, String, u16)>> {
    let malformed = |what: &str| {
        redis::RedisError::from((
            redis::ErrorKind::Parse,
            "unexpected CLUSTER SLOTS answer",
            what.to_owned(),
        ))
    };
    let Value::Array(ranges) = answer else {
        return Err(malformed("not an array"));
    };
    let mut out = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Value::Array(parts) = range else {
            return Err(malformed("a range is not an array"));
        };
        // `[first, last, [host, port, id, ...], replicas...]`
        let mut parts = parts.into_iter();
        let (Some(from), Some(to), Some(Value::Array(master))) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(malformed("a range without a master"));
        };
        let from: u16 = redis::from_redis_value(from)?;
        let to: u16 = redis::from_redis_value(to)?;
        let mut master = master.into_iter();
        let (Some(host), Some(port)) = (master.next(), master.next()) else {
            return Err(malformed("a master without host and port"));
        };
        let host: String = redis::from_redis_value(host)?;
        let port: u16 = redis::from_redis_value(port)?;
        if !host.is_empty() && host != "?" {
            out.push((from, to, host, port));
        }
    }
    Ok(out)
}

/// The cluster slot of `key`: CRC16 (XMODEM) of the key, or of its hash
/// tag (what lies between the first `{` and the first `}` after it, when
/// that is not empty), modulo 16384.
fn slot_of(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16(hashed) % SLOTS as u16
}

/// CRC16-CCITT (XMODEM), as Redis Cluster hashes keys; one table lookup
/// per byte.
fn crc16(bytes: &[u8]) -> u16 {
    const TABLE: [u16; 256] = {
        let mut table = [0u16; 256];
        let mut i = 0;
        while i < 256 {
            // `i` is below 256.
            #[allow(clippy::cast_possible_truncation)]
            let mut crc = (i as u16) << 8;
            let mut bit = 0;
            while bit < 8 {
                crc = if crc & 0x8000 == 0 {
                    crc << 1
                } else {
                    (crc << 1) ^ 0x1021
                };
                bit += 1;
            }
            table[i] = crc;
            i += 1;
        }
        table
    };
    bytes.iter().fold(0u16, |crc, &b| {
        (crc << 8) ^ TABLE[usize::from((crc >> 8) as u8 ^ b)]
    })
}

/// Sends a command a master did not run where it belongs (see
/// [`Inner::redirect`]), refreshing the map after a `MOVED`. Boxed: only
/// while slots move.
fn resend(
    inner: Arc<Inner>,
    redirected: Redirected,
    durable: Option<u16>,
) -> BoxFuture<'static, RedisResult<Value>> {
    if matches!(redirected.error.code(), Some("MOVED" | "CLUSTERDOWN")) {
        inner.refresh_soon();
    }
    Box::pin(async move {
        let Redirected { cmd, error } = redirected;
        inner.redirect(cmd, error, durable).await
    })
}

/// A master of a cluster, owned: what a [`Ticket`] holds while its task
/// waits to run.
struct NodeOf {
    inner: Arc<Inner>,
    node: Arc<Node>,
}

impl AsRef<Queue> for NodeOf {
    fn as_ref(&self) -> &Queue {
        &self.node.queue
    }
}

impl Connections for Nodes {
    type Con = ClusterConnection;

    /// The cluster client (for `SCRIPT LOAD`, sent to every node).
    fn pick(&self, _key: &str) -> ClusterConnection {
        self.0.cluster.clone()
    }

    /// Queued at once on the queue of the key's master (see [`batch`]); a
    /// command that master did not run (a redirection) is sent again alone
    /// through the cluster client, and the map refreshed.
    fn query(
        &self,
        key: &str,
        cmd: Cmd,
        durable: bool,
    ) -> impl Future<Output = RedisResult<Value>> + Send {
        let inner = Arc::clone(&self.0);
        let slot = slot_of(key.as_bytes());
        let node = inner.map.load().node(slot).cloned();
        let durable_slot = (durable && inner.replicas.is_some()).then_some(slot);
        // The rare paths (a slot the map does not know, a redirection) are
        // boxed: the future of every claim on a cluster, and so an
        // `AnyStore`'s, carries only a receiver and a pointer.
        let pending = match node {
            Some(node) => {
                let (answer, first) = node.queue.push(cmd, durable);
                if first {
                    let ticket = Ticket::new(NodeOf {
                        inner: Arc::clone(&inner),
                        node,
                    });
                    tokio::spawn(batch::flush(
                        ticket,
                        |n: &NodeOf| ConnectionManager::clone(&n.node.manager.load()),
                        |n: &NodeOf, took| n.inner.report_late(took),
                        inner.replicas,
                    ));
                }
                Ok(answer)
            }
            None => Err(Box::pin(async move {
                inner.refresh_soon();
                inner.alone(cmd, durable_slot).await
            }) as BoxFuture<'static, RedisResult<Value>>),
        };
        let inner = Arc::clone(&self.0);
        async move {
            let pending = match pending {
                Ok(pending) => pending,
                Err(alone) => return alone.await,
            };
            // The answer is matched before the next await, so that it is
            // not kept in the future while a redirected command is resent.
            let resending = match pending.answer_or_redirect().await {
                Ok(answer) => {
                    if answer.as_ref().is_err_and(|e| e.code().is_none()) {
                        // No answer from the master (gone, or silent): a
                        // replica may be taking its slots over.
                        inner.refresh_soon();
                    }
                    return answer;
                }
                Err(redirected) => resend(inner, redirected, durable_slot),
            };
            resending.await
        }
    }

    /// Replaces every master's connection with a fresh one (made on first
    /// use), and refreshes the map; the cluster client replaces its own
    /// broken connections itself.
    fn reconnect(&self) {
        let map = self.0.map.load();
        for node in &map.nodes {
            match ConnectionManager::new_lazy_with_config(node.client.clone(), manager_config()) {
                Ok(fresh) => node.manager.store(Arc::new(fresh)),
                Err(e) => tracing::warn!(error = %e, "could not replace a cluster connection"),
            }
        }
        self.0.refresh_soon();
        metrics::counter!("norepeat_store_reconnects_total").increment(1);
        tracing::warn!("replaced the cluster connections after repeated timeouts");
    }

    /// Answers to batches sent straight to a master are reported; a call
    /// given up while sent again through the cluster client (a
    /// redirection) is dropped inside that client, which does not say when
    /// its answer came.
    fn report_late_answers(&self, to: LateAnswers) {
        let mut late = self.0.late.lock().unwrap_or_else(PoisonError::into_inner);
        late.retain(LateAnswers::is_live);
        late.push(to);
    }
}

impl_store!(ClusterStore, "cluster");

#[cfg(test)]
mod tests {
    use super::*;

    /// The values `CLUSTER KEYSLOT` gives (Redis 7.0).
    #[test]
    fn slots_are_those_redis_computes() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"bar"), 5061);
        assert_eq!(slot_of(b""), 0);
        // A hash tag: only what lies between the braces counts.
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(slot_of(b"x{foo}y"), 12182);
        // An empty tag, or none closed, hashes the whole key.
        assert_eq!(slot_of(b"{}foo"), crc16(b"{}foo") % 16384);
        assert_eq!(slot_of(b"{foo"), crc16(b"{foo") % 16384);
        // The first `{` and the first `}` after it.
        assert_eq!(slot_of(b"{foo}{bar}"), 12182);
        assert_eq!(slot_of(b"{{foo}}"), slot_of(b"{foo"));
    }

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"0123abcd".to_vec()),
            Value::Array(vec![]),
        ])
    }

    /// Each range names its master first, then its replicas (ignored); a
    /// master without an endpoint leaves its range unmapped.
    #[test]
    fn cluster_slots_answers_give_each_range_its_master() {
        let answer = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("10.0.0.1", 7000),
                node("10.0.0.4", 7003),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(10922),
                node("10.0.0.2", 7001),
            ]),
            Value::Array(vec![Value::Int(10923), Value::Int(16383), node("", 7002)]),
        ]);
        assert_eq!(
            slot_ranges(answer).unwrap(),
            vec![
                (0, 5460, "10.0.0.1".to_owned(), 7000),
                (5461, 10922, "10.0.0.2".to_owned(), 7001),
            ]
        );
        assert!(slot_ranges(Value::Array(vec![Value::Array(vec![Value::Int(0)])])).is_err());
    }
}
