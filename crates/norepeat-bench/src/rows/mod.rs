//! The rows: one function per row, each building what it drives and
//! handing one operation to the harness.
//!
//! Rows that need no HTTP or idempotency layer live here; the
//! `Idempotency-Key` rows in [`idempotency`] (and on a SQL store in
//! [`sql`]), the loopback HTTP rows in [`http`].

mod cluster;
mod gateway;
mod http;
pub(crate) mod idempotency;
mod replicas;
pub(crate) mod sql;

pub(crate) use gateway::Programs;
pub(crate) use replicas::ReplicaPair;

use super::error::BenchError;
use super::harness::{Load, Sample, measure};
use norepeat::fingerprint::Digest;
use norepeat::fingerprint::{FingerprintGuard, FingerprintGuardError};
use norepeat::problem::Problem;
use norepeat::ratelimit::{Algorithm, Quota, RateLimiter};
use norepeat::store::{AnyStore, Store};
use norepeat::token::TokenGuard;
use norepeat::token::TokenSigner;
use redis::aio::ConnectionManager;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Every row, in the order they run. `redis.raw` sits right before the
/// rows it is the yardstick of, and each gateway row beside its anchor,
/// so they share a sitting (and, with `--rounds`, alternate).
pub const RESULT_NAMES: [&str; 33] = [
    "token.issue",
    "redis.raw",
    "token.consume",
    "fingerprint.acquire",
    "fingerprint.duplicate",
    "fingerprint.acquire.cluster",
    "fingerprint.acquire.replicas0",
    "fingerprint.acquire.replicas1",
    "idempotency.claim",
    "idempotency.store_cycle",
    "idempotency.cycle",
    "idempotency.replay",
    "ratelimit.gcra",
    "http.unguarded",
    "http.guarded",
    "http.handrolled",
    "gateway.direct",
    "gateway.nginx",
    "gateway.passthrough",
    "gateway.before.passthrough",
    "gateway.nginx_post",
    "gateway.nginx_lua",
    "gateway.guarded",
    "gateway.before.guarded",
    "gateway.idempotent_proxy",
    "gateway.idempotency",
    "gateway.before.idempotency",
    "gateway.idempotent_proxy_replay",
    "gateway.replay",
    "gateway.inproc.direct",
    "gateway.inproc.passthrough",
    "gateway.inproc.guarded",
    "gateway.inproc.nginx",
];

/// What every row gets.
pub(crate) struct RowCtx<'a> {
    pub(crate) store: &'a AnyStore,
    pub(crate) load: &'a Load,
    /// Random per run: keeps runs against one Redis apart.
    pub(crate) run: u64,
    /// The Redis URL, for `redis.raw`.
    pub(crate) url: Option<&'a str>,
    /// The nodes of a Redis Cluster (`--cluster`), for
    /// `fingerprint.acquire.cluster`.
    pub(crate) cluster: &'a [String],
    /// A master with one replica linked (`--replicas`), for
    /// `fingerprint.acquire.replicas0` and `.replicas1`.
    pub(crate) replicated: Option<&'a ReplicaPair>,
    /// How to start this bench again, as the gateway rows' load generator.
    pub(crate) me: &'a super::SelfCommand,
    /// The programs the gateway rows run.
    pub(crate) programs: &'a Programs,
}

/// Measures the row `name`; `None` where it does not apply (`redis.raw`
/// on a store other than one Redis).
pub(crate) async fn row(name: &'static str, cx: &RowCtx<'_>) -> Result<Option<Sample>, BenchError> {
    let (store, load, run) = (cx.store, cx.load, cx.run);
    Ok(Some(match name {
        "token.issue" => token_issue(store, load).await?,
        "redis.raw" => match (store, cx.url) {
            (AnyStore::Redis(_), Some(url)) => redis_raw(url, load, run).await?,
            _ => return Ok(None),
        },
        "token.consume" => token_consume(store, load).await?,
        "fingerprint.acquire" => fingerprint_acquire(store, load, run).await?,
        "fingerprint.duplicate" => fingerprint_duplicate(store, load, run).await?,
        "fingerprint.acquire.cluster" if !cx.cluster.is_empty() => {
            cluster::fingerprint_acquire_cluster(cx.cluster, load, run).await?
        }
        "fingerprint.acquire.cluster" => return Ok(None),
        "fingerprint.acquire.replicas0" | "fingerprint.acquire.replicas1" => {
            let Some(pair) = cx.replicated else {
                return Ok(None);
            };
            replicas::fingerprint_acquire_replicas(name, pair, load, run).await?
        }
        "idempotency.claim" => idempotency::claim(store, load, run).await?,
        "idempotency.store_cycle" => idempotency::store_cycle(store, load, run).await?,
        "idempotency.cycle" => idempotency::cycle(store, load, run).await?,
        "idempotency.replay" => idempotency::replay(store, load, run).await?,
        "ratelimit.gcra" => ratelimit_gcra(store, load, run).await?,
        "http.unguarded" => http::http(store, load, run, http::Guard::Unguarded, None).await?,
        "http.guarded" => http::http(store, load, run, http::Guard::Layer, None).await?,
        "http.handrolled" => match (store, cx.url) {
            (AnyStore::Redis(_), Some(url)) => {
                http::http(store, load, run, http::Guard::HandRolled, Some(url)).await?
            }
            (AnyStore::Memory(_), _) => {
                http::http(store, load, run, http::Guard::HandRolled, None).await?
            }
            _ => return Ok(None),
        },
        n if n.starts_with("gateway.") => {
            return gateway::row(name, cx, load, run).await;
        }
        _ => return Ok(None),
    }))
}

/// A fingerprint unique to this run, `purpose` and `id`. A fingerprint
/// key keeps the first 60 bits: 20 of the run, 4 of the purpose, 36 of the
/// id (68 billion per row and run).
pub(crate) fn fingerprint(run: u64, purpose: u8, id: u64) -> Digest {
    let head = (run & 0xF_FFFF) << 44 | u64::from(purpose & 0xF) << 40 | (id & 0xF_FFFF_FFFF) << 4;
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&head.to_be_bytes());
    b[8..16].copy_from_slice(&id.to_le_bytes());
    Digest(b)
}

async fn token_issue(store: &AnyStore, load: &Load) -> Result<Sample, BenchError> {
    let guard = Arc::new(TokenGuard::new(store.clone(), TokenSigner::random()));
    measure(load, move |_| {
        let g = Arc::clone(&guard);
        async move {
            let t = g.issue("bench-user");
            std::hint::black_box(t);
            Ok(())
        }
    })
    .await
}

/// Plain redis-rs: `SET key 1 NX PX 3000` of a fresh key, over as many
/// `ConnectionManager`s as the store holds ([`norepeat::store::DEFAULT_CONNECTIONS`]),
/// used in turn (the store picks a key's connection by a hash of the key;
/// over fresh keys either spreads them evenly). The store does not lend its
/// connections out, so these are new ones of the same kind, to the same
/// server, in the same process.
async fn redis_raw(url: &str, load: &Load, run: u64) -> Result<Sample, BenchError> {
    let client = redis::Client::open(url)?;
    let mut managers = Vec::new();
    for _ in 0..norepeat::store::DEFAULT_CONNECTIONS.max(1) {
        managers.push(ConnectionManager::new(client.clone()).await?);
    }
    let managers: Arc<[ConnectionManager]> = managers.into();
    let next = Arc::new(AtomicUsize::new(0));
    let prefix = format!("nr:b{:08x}", run as u32);
    measure(load, move |id| {
        let i = next.fetch_add(1, Ordering::Relaxed) % managers.len();
        let mut con = managers[i].clone();
        let key = format!("{prefix}{id:x}");
        async move {
            let set: Option<String> = set_nx_px(&key).query_async(&mut con).await?;
            if set.is_none() {
                return Err(BenchError::unexpected("redis.raw", "a fresh key was taken"));
            }
            Ok(())
        }
    })
    .await
}

/// `SET key 1 NX PX 3000`: what `redis.raw` times and `http.handrolled`'s
/// handler sends.
pub(crate) fn set_nx_px(key: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("SET");
    cmd.arg(key).arg(1).arg("NX").arg("PX").arg(3_000);
    cmd
}

async fn token_consume(store: &AnyStore, load: &Load) -> Result<Sample, BenchError> {
    // Used tokens are kept 3 s, as `redis.raw`'s keys: every row's keys
    // expire alike (see `probe::Settle`). One process has one clock: no
    // skew to allow for (the default 60 s would keep each marker a minute
    // longer, and the next rows would start among 300k unexpired keys).
    let guard = Arc::new(
        TokenGuard::new(store.clone(), TokenSigner::random())
            .ttl(Duration::from_secs(3))
            .clock_skew(Duration::ZERO),
    );
    measure(load, move |_| {
        let g = Arc::clone(&guard);
        let token = g.issue("bench-user").token;
        async move {
            g.consume("bench-user", &token).await.map_err(|p| {
                BenchError::unexpected(
                    "token.consume",
                    format!("refused: {}", Problem::from(p).code.as_str()),
                )
            })
        }
    })
    .await
}

async fn fingerprint_acquire(
    store: &AnyStore,
    load: &Load,
    run: u64,
) -> Result<Sample, BenchError> {
    fingerprint_acquire_on(store.clone(), "fingerprint.acquire", 1, load, run).await
}

/// A fresh fingerprint (of `purpose`, apart from the other rows') acquired
/// and finished per operation on `store`, as the row `row`: a refusal or
/// a store failure (admitted fail-open) ends the row with an error.
pub(crate) async fn fingerprint_acquire_on<S: Store + Clone>(
    store: S,
    row: &'static str,
    purpose: u8,
    load: &Load,
    run: u64,
) -> Result<Sample, BenchError> {
    let guard = Arc::new(FingerprintGuard::new(store));
    measure(load, move |id| {
        let g = Arc::clone(&guard);
        let fp = fingerprint(run, purpose, id);
        async move {
            let lease = g.acquire(&fp).await.map_err(|p| {
                BenchError::unexpected(row, format!("refused: {}", Problem::from(p).code.as_str()))
            })?;
            if !lease.is_held() {
                return Err(BenchError::unexpected(
                    row,
                    "the store failed (admitted fail-open)",
                ));
            }
            lease.finish(true).await;
            Ok(())
        }
    })
    .await
}

async fn fingerprint_duplicate(
    store: &AnyStore,
    load: &Load,
    run: u64,
) -> Result<Sample, BenchError> {
    let hold = load.warmup + load.duration + Duration::from_secs(30);
    let guard = Arc::new(FingerprintGuard::new(store.clone()).window(hold));
    let held = load.concurrency as u64;
    for id in 0..held {
        let lease = guard.acquire(&fingerprint(run, 2, id)).await.map_err(|p| {
            BenchError::unexpected(
                "fingerprint.duplicate",
                format!("setup: {}", Problem::from(p).code.as_str()),
            )
        })?;
        lease.finish(true).await;
    }
    measure(load, move |id| {
        let g = Arc::clone(&guard);
        let fp = fingerprint(run, 2, id % held);
        async move {
            match g.acquire(&fp).await {
                Err(FingerprintGuardError::Duplicate { .. }) => Ok(()),
                Err(p) => Err(BenchError::unexpected(
                    "fingerprint.duplicate",
                    Problem::from(p).code.as_str(),
                )),
                Ok(_) => Err(BenchError::unexpected(
                    "fingerprint.duplicate",
                    "a held fingerprint was admitted",
                )),
            }
        }
    })
    .await
}

async fn ratelimit_gcra(store: &AnyStore, load: &Load, run: u64) -> Result<Sample, BenchError> {
    let rate = NonZeroU32::new(1_000_000)
        .ok_or_else(|| BenchError::unexpected("ratelimit.gcra", "zero rate"))?;
    let limiter = Arc::new(
        RateLimiter::new(store.clone(), Quota::per_second(rate))
            .name(format!("bench-{run:016x}"))
            .algorithm(Algorithm::Gcra),
    );
    measure(load, move |id| {
        let l = Arc::clone(&limiter);
        let key = format!("user-{}", id % 1024);
        async move {
            let d = l
                .check(&key)
                .await
                .map_err(|e| BenchError::unexpected("ratelimit.gcra", e.to_string()))?;
            std::hint::black_box(d);
            Ok(())
        }
    })
    .await
}
