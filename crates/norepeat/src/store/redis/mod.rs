//! Redis and Redis Cluster backends, and a Redis whose master Sentinel
//! names.
//!
//! # Replicas
//!
//! A store made from a URL with `?replicas=N` (and `replicas_timeout=T`,
//! 100 ms unless given) ends every batch that carries a claim or a
//! completion with `WAIT N T`, on the same connection and in the same
//! pipeline; a claim or completion that wrote, and that fewer than `N`
//! replicas acknowledged within `T`, fails with
//! [`StoreError::NotReplicated`] (a store failure: the route's policy
//! applies; a refused request's claim is taken back). See [`batch`] for
//! how, and the crate README for what it guarantees.

use crate::store::{KeyOp, KeyReply, RateDecision, RateOp, StoreError, ttl_ms};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisError, RedisResult, Script, ServerErrorKind, Value};
use std::sync::Arc;
use std::time::Duration;

/// The Lua scripts, each hashed once; they run by EVALSHA, and are loaded
/// again when a (restarted or newly promoted) server answers NOSCRIPT (see
/// [`Backend::script`]).
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
    if e.code() == Some(batch::NOT_REPLICATED) {
        StoreError::NotReplicated(e.detail().unwrap_or_default().to_owned())
    } else if e.is_timeout() {
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

impl<C: Connections + Send + Sync + 'static> Backend<C> {
    async fn put_if_absent(
        &self,
        key: &str,
        value: &[u8],
        ttl: Duration,
    ) -> Result<Option<Bytes>, StoreError> {
        let mut cmd = Cmd::with_capacity(7, 32 + key.len() + value.len());
        cmd.arg("SET")
            .arg(key)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms(ttl))
            .arg("GET");
        let answer = self.con.query(key, cmd, true).await.map_err(map_err)?;
        let old: Option<Vec<u8>> = redis::from_redis_value(answer).map_err(protocol)?;
        Ok(old.map(Bytes::from))
    }

    /// Runs `script` by `EVALSHA` (the command `evalsha` builds), queued
    /// like a claim so that it shares its connection's next write. A server
    /// that answers `NOSCRIPT` (restarted, or newly promoted) did not run
    /// it: the script is loaded there and the command sent once more, as
    /// redis-rs's own `invoke_async` does. `durable`: a write the store's
    /// replicas must have (a completion).
    async fn script(
        &self,
        script: &Script,
        key: &str,
        evalsha: impl Fn() -> Cmd,
        durable: bool,
    ) -> RedisResult<Value> {
        match self.con.query(key, evalsha(), durable).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                script.load_async(&mut self.con.pick(key)).await?;
                self.con.query(key, evalsha(), durable).await
            }
            answer => answer,
        }
    }

    /// An owner-checked script (release, renew, replace): `args`, then
    /// `ttl` in milliseconds when given; `true` when it changed the key.
    /// `durable`: the store's replicas must have it (a completion).
    ///
    /// Boxed: a script's future (EVALSHA, and SCRIPT LOAD on NOSCRIPT) is
    /// several times the size of a `SET`'s, and [`execute`](Self::execute)'s
    /// future is part of every claim's, held for every request in flight. A
    /// claim (`SET NX`) allocates nothing more; a script, once per request
    /// at its end, one small box.
    fn eval_bool<'a>(
        &'a self,
        script: &'a Script,
        key: &'a str,
        args: &'a [&'a [u8]],
        ttl: Option<Duration>,
        durable: bool,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let evalsha = || {
                let extra = args.iter().map(|a| a.len()).sum::<usize>() + 20;
                let mut cmd = evalsha(script, key, args.len() + 1, extra);
                for a in args {
                    cmd.arg(*a);
                }
                if let Some(ttl) = ttl {
                    cmd.arg(itoa::Buffer::new().format(ttl_ms(ttl)));
                }
                cmd
            };
            let answer = self
                .script(script, key, evalsha, durable)
                .await
                .map_err(map_err)?;
            let n: i64 = redis::from_redis_value(answer).map_err(protocol)?;
            Ok(n == 1)
        })
    }

    async fn eval_rate(
        &self,
        script: &Script,
        key: &str,
        a: u64,
        b: u64,
    ) -> Result<RateDecision, StoreError> {
        let evalsha = || {
            let mut cmd = evalsha(script, key, 2, 40);
            cmd.arg(a).arg(b);
            cmd
        };
        let answer = self
            .script(script, key, evalsha, false)
            .await
            .map_err(map_err)?;
        let v: (i64, i64, i64) = redis::from_redis_value(answer).map_err(protocol)?;
        Ok(decision(v))
    }
}

/// `EVALSHA <sha1> 1 key`, for `more` arguments of `more_bytes` in all
/// to follow. Commands are built with their buffers sized
/// (`Cmd::with_capacity`; `redis::cmd` starts them empty, and their growth
/// was 5 % of an idempotency cycle's instructions; BENCHMARKS.md, issue 39).
fn evalsha(script: &Script, key: &str, more: usize, more_bytes: usize) -> Cmd {
    let mut cmd = Cmd::with_capacity(4 + more, 7 + 40 + 1 + key.len() + more_bytes);
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(1).arg(key);
    cmd
}

/// An answer of the wrong shape.
fn protocol(e: redis::ParsingError) -> StoreError {
    StoreError::Protocol(e.to_string())
}

impl<C: Connections + Send + Sync + 'static> Backend<C> {
    /// One operation: a claim is one `SET`, the rest one script each.
    async fn execute(&self, op: KeyOp<'_>) -> Result<KeyReply, StoreError> {
        let s = &self.scripts;
        match op {
            KeyOp::PutIfAbsent { key, value, ttl } => self
                .put_if_absent(key, value, ttl)
                .await
                .map(KeyReply::Held),
            KeyOp::DeleteIfEquals { key, expected } => self
                .eval_bool(&s.release, key, &[expected], None, false)
                .await
                .map(KeyReply::Changed),
            KeyOp::ExpireIfEquals { key, expected, ttl } => self
                .eval_bool(&s.renew, key, &[expected], Some(ttl), false)
                .await
                .map(KeyReply::Changed),
            KeyOp::ReplaceIfEquals {
                key,
                expected,
                value,
                ttl,
            } => self
                .eval_bool(&s.replace, key, &[expected, value], Some(ttl), true)
                .await
                .map(KeyReply::Changed),
            KeyOp::Get { key } => {
                let mut cmd = Cmd::with_capacity(2, 3 + key.len());
                cmd.arg("GET").arg(key);
                let answer = self.con.query(key, cmd, false).await.map_err(map_err)?;
                let v: Option<Vec<u8>> = redis::from_redis_value(answer).map_err(protocol)?;
                Ok(KeyReply::Held(v.map(Bytes::from)))
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
        impl $crate::store::KeyValueStore for $ty {
            fn execute(
                &self,
                op: $crate::store::KeyOp<'_>,
            ) -> impl std::future::Future<
                Output = Result<$crate::store::KeyReply, $crate::store::StoreError>,
            > + Send {
                self.0.execute(op)
            }

            fn kind(&self) -> &'static str {
                $kind
            }

            fn reconnect(&self) {
                super::Connections::reconnect(&self.0.con);
            }

            fn report_late_answers(&self, to: $crate::store::LateAnswers) {
                super::Connections::report_late_answers(&self.0.con, to);
            }
        }

        impl $crate::store::RateStore for $ty {
            fn rate(
                &self,
                op: $crate::store::RateOp<'_>,
            ) -> impl std::future::Future<
                Output = Result<$crate::store::RateDecision, $crate::store::StoreError>,
            > + Send {
                self.0.rate(op)
            }
        }
    };
}

/// Where a [`Backend`] gets the connection of one call, and how that is
/// replaced when its replies stop coming.
trait Connections {
    /// The connection one call is sent on.
    type Con: ConnectionLike + Send;

    /// The connection of the calls on `key`: a cheap handle (an `Arc` or a
    /// channel sender), so a call goes straight to redis-rs with no
    /// forwarding future of ours in between.
    fn pick(&self, key: &str) -> Self::Con;

    /// Sends one command on `key` (a claim's `SET`, a script's `EVALSHA`)
    /// and returns its answer, a server error as an `Err`. The commands on
    /// one key leave on one connection, in the order of these calls: a
    /// release never overtakes a completion sent before it. `durable`: a
    /// write the store's replicas must have, when it asks for them (see
    /// [`batch`]).
    fn query(
        &self,
        key: &str,
        cmd: Cmd,
        durable: bool,
    ) -> impl Future<Output = RedisResult<Value>> + Send;

    /// Replaces connections whose replies stopped coming.
    fn reconnect(&self);

    /// Reports the answers that arrive after their callers gave up to
    /// `to` (see [`KeyValueStore::report_late_answers`](crate::store::KeyValueStore::report_late_answers)).
    fn report_late_answers(&self, to: crate::store::LateAnswers);
}

/// What [`AnyStore::check_url`](crate::store::AnyStore::check_url) finds
/// wrong in a Redis URL (one Redis, a Sentinel URL, or one node of a
/// cluster), with nothing sent: its query, and a Sentinel URL's parts.
/// (The rest is redis-rs's to read when connecting: a `rediss://` URL,
/// for one, is refused there by a build without TLS.)
pub(crate) fn check_url(url: &str) -> Result<(), StoreError> {
    let checked = if url::is_sentinel(url) {
        url::sentinel(url).map(drop)
    } else {
        url::split_settings(url, &["protocol"]).map(drop)
    };
    checked.map_err(|e| single::invalid(url, &e))
}

mod batch;
mod cluster;
mod persistence;
mod sentinel;
mod single;
pub(crate) mod url;

pub use cluster::ClusterStore;
pub use single::{DEFAULT_CONNECTIONS, RedisStore};
