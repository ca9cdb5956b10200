// Over 400 lines: three probes of one Redis server (the settling between rows, memory per key, the ceiling) share its readers (INFO, DBSIZE, UNLINK); 65 lines are their tests.
//! Probes of the Redis server itself: memory per key (`INFO memory`
//! around many keys written through the guards, on a private
//! `redis-server` where one can be started) and the store's ceiling
//! (a `redis-benchmark` subprocess).

use super::error::BenchError;
use super::harness::Load;
use super::redis_info::{info, info_field};
use super::report::{Ceiling, MemoryResult};
use super::rows::fingerprint;
use super::rows::idempotency::{Held, Pending, created, held_handler, let_go, payment, status_of};
use norepeat::fingerprint::FingerprintGuard;
use norepeat::idempotency::IdempotencyLayer;
use norepeat::keys::{KeyBuilder, Namespace};
use norepeat::store::AnyStore;
use redis::aio::MultiplexedConnection;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::Semaphore;
use tower::Layer;

/// Waits, before a row, until the keys the earlier rows left behind have
/// expired and the server has reclaimed them.
///
/// Every key the bench writes has a TTL (3 s in the rows that write many),
/// and Redis reclaims expired keys in its own background cycle, on the
/// same two cores as the bench. Without a wait, a row pays for the row
/// before it: `token.consume` ran while `redis.raw`'s million keys were
/// being expired, `fingerprint.acquire` while `token.consume`'s were. The
/// count watched is the server's keys with a TTL (`INFO keyspace`,
/// `expires=`, every database), against what it held when the run began.
pub(crate) struct Settle {
    con: MultiplexedConnection,
    baseline: u64,
}

impl Settle {
    /// Keys with a TTL the server may hold above the baseline and still
    /// count as settled (a row's few long-lived keys, other clients').
    const SLACK: u64 = 2_000;
    /// The longest wait before a row; a row that starts unsettled is
    /// logged.
    const MAX_WAIT: Duration = Duration::from_secs(20);

    /// Connects and reads the baseline.
    pub(crate) async fn new(url: &str) -> Result<Self, BenchError> {
        let mut con = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        let baseline = expiring_keys(&mut con).await?;
        Ok(Self { con, baseline })
    }

    /// Waits until the server is back to the baseline (plus
    /// [`Self::SLACK`]), at most [`Self::MAX_WAIT`]; returns how long it
    /// waited.
    pub(crate) async fn wait(&mut self, row: &str) -> Result<Duration, BenchError> {
        let start = std::time::Instant::now();
        loop {
            let now = expiring_keys(&mut self.con).await?;
            if now <= self.baseline + Self::SLACK {
                return Ok(start.elapsed());
            }
            if start.elapsed() >= Self::MAX_WAIT {
                tracing::warn!(
                    row,
                    keys = now - self.baseline,
                    "starting the row before earlier rows' keys expired"
                );
                return Ok(start.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Keys with a TTL in every database (`INFO keyspace`, `expires=`).
async fn expiring_keys(con: &mut MultiplexedConnection) -> Result<u64, BenchError> {
    Ok(sum_expires(&info(con, "keyspace").await?))
}

/// The sum of `expires=N` over the `dbK:` lines of `INFO keyspace`.
fn sum_expires(info: &str) -> u64 {
    info.lines()
        .filter(|l| l.starts_with("db"))
        .filter_map(|l| {
            l.split([':', ','])
                .find_map(|f| f.strip_prefix("expires="))?
                .trim()
                .parse::<u64>()
                .ok()
        })
        .sum()
}

async fn used_memory(con: &mut MultiplexedConnection) -> Result<i64, BenchError> {
    info_field(con, "memory", "used_memory")
        .await?
        .parse()
        .map_err(|_| BenchError::Probe("used_memory is not a number".into()))
}

async fn dbsize(con: &mut MultiplexedConnection) -> Result<i64, BenchError> {
    Ok(redis::cmd("DBSIZE").query_async(con).await?)
}

/// Reads `used_memory` until it settles (the server finishes rehashing its
/// tables in the background), at most ~2 s.
async fn settled_memory(con: &mut MultiplexedConnection) -> Result<i64, BenchError> {
    let mut prev = used_memory(con).await?;
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = used_memory(con).await?;
        if (now - prev).abs() <= prev / 2_000 {
            return Ok(now);
        }
        prev = now;
    }
    Ok(prev)
}

async fn unlink(con: &mut MultiplexedConnection, keys: Vec<String>) -> Result<(), BenchError> {
    for batch in keys.chunks(1_000) {
        let _: i64 = redis::cmd("UNLINK").arg(batch).query_async(con).await?;
    }
    Ok(())
}

#[allow(clippy::cast_precision_loss)]
fn per_key(before: i64, after: i64, n: u64) -> f64 {
    (after - before) as f64 / n as f64
}

/// Memory per key on the Redis at `url`: `n` fingerprint keys written
/// through [`FingerprintGuard`], then `n` `Idempotency-Key` records
/// claimed through [`IdempotencyLayer`] (handlers held: in progress), then
/// the same records completed with a 64-byte JSON body. Each figure is the
/// growth of `used_memory` (settled) over `n`. Every key is deleted after.
pub(crate) async fn memory_per_key(
    url: &str,
    server: String,
    run: u64,
    n: usize,
    load: &Load,
) -> Result<MemoryResult, BenchError> {
    let store = AnyStore::from_url(Some(url)).await?;
    let mut con = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let n = n.max(1) as u64;
    let version = info_field(&mut con, "server", "redis_version").await?;

    // Fingerprint keys, held 5 minutes so none expires meanwhile.
    let guard = Arc::new(FingerprintGuard::new(store.clone()).window(Duration::from_secs(300)));
    let before = settled_memory(&mut con).await?;
    let keys_before = dbsize(&mut con).await?;
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..load.concurrency {
        let guard = Arc::clone(&guard);
        let next = Arc::clone(&next);
        tasks.push(tokio::spawn(async move {
            loop {
                let id = next.fetch_add(1, Ordering::Relaxed);
                if id >= n {
                    return Ok::<_, BenchError>(());
                }
                let lease = guard.acquire(&fingerprint(run, 3, id)).await.map_err(|p| {
                    BenchError::Probe(format!(
                        "fingerprint refused: {}",
                        norepeat::problem::Problem::from(p).code.as_str()
                    ))
                })?;
                if !lease.is_held() {
                    return Err(BenchError::Probe("the store failed".into()));
                }
                lease.finish(true).await;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let after = settled_memory(&mut con).await?;
    let dbsize_delta = dbsize(&mut con).await? - keys_before;
    let keys = (0..n)
        .map(|i| guard.key_of(&fingerprint(run, 3, i)))
        .collect();
    unlink(&mut con, keys).await?;
    let bytes_per_fingerprint_key = per_key(before, after, n);

    let (in_progress, completed) = idempotency_records(&store, &mut con, run, n, load).await?;
    Ok(MemoryResult {
        bytes_per_fingerprint_key,
        bytes_per_idempotency_in_progress: in_progress,
        bytes_per_idempotency_completed: completed,
        keys: n,
        dbsize_delta,
        server: format!("{server}, Redis {version}"),
    })
}

/// Bytes per in-progress and per completed `Idempotency-Key` record.
async fn idempotency_records(
    store: &AnyStore,
    con: &mut MultiplexedConnection,
    run: u64,
    n: u64,
    load: &Load,
) -> Result<(f64, f64), BenchError> {
    let svc = IdempotencyLayer::new(store.clone())
        .route("/payments")
        .lease(Duration::from_secs(300))
        .lease_renewal(false)
        .retention(Duration::from_secs(300))
        // Every handler is held until all records are counted: thousands
        // at once, past the default bound on detached handlers.
        .max_detached(usize::MAX)
        .layer(held_handler(created));
    let client_key = |i: u64| format!("m{run:x}-{i}");
    let before = settled_memory(con).await?;
    // At most `concurrency` claims in flight; a permit comes back when its
    // handler is entered (its record is in progress).
    let permits = load.concurrency.max(1);
    let sem = Arc::new(Semaphore::new(permits));
    let mut pending: Vec<Pending> = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
    for i in 0..n {
        let permit = Arc::clone(&sem)
            .acquire_owned()
            .await
            .map_err(|e| BenchError::Probe(e.to_string()))?;
        let mut req = payment(client_key(i))?;
        let (held, holder) = Held::new();
        req.extensions_mut().insert(held);
        pending.push((holder.go, tokio::spawn(status_of(svc.clone(), req))));
        let entered = holder.entered;
        tokio::spawn(async move {
            let _ = entered.await;
            drop(permit);
        });
    }
    let all = u32::try_from(permits).unwrap_or(u32::MAX);
    let _all_entered = sem
        .acquire_many(all)
        .await
        .map_err(|e| BenchError::Probe(e.to_string()))?;
    if pending.iter().any(|(_, t)| t.is_finished()) {
        return Err(BenchError::Probe("an idempotency claim was refused".into()));
    }
    let in_progress = settled_memory(con).await?;
    for status in let_go(pending, permits).await? {
        if status != http::StatusCode::CREATED {
            return Err(BenchError::Probe(format!(
                "an idempotency record was not completed: {status}"
            )));
        }
    }
    let completed = settled_memory(con).await?;
    let keys = (0..n)
        .map(|i| {
            KeyBuilder::default().key(
                Namespace::Idempotency,
                &[
                    b"bench-user",
                    b"POST",
                    b"/payments",
                    client_key(i).as_bytes(),
                ],
            )
        })
        .collect();
    unlink(con, keys).await?;
    Ok((
        per_key(before, in_progress, n),
        per_key(before, completed, n),
    ))
}

/// The key of the ceiling's fresh-key run: `redis-benchmark -r` replaces
/// `__rand_int__` (and nothing else) with a random 12-digit number, so
/// each `SET` creates a key, as a claim does.
const FRESH_KEY: &str = "norepeat:bench:ceiling:__rand_int__";
/// The key of the one-key run: every `SET` after the first finds it and is
/// refused, as a duplicate is.
const ONE_KEY: &str = "norepeat:bench:ceiling:one";

/// Runs `redis-benchmark` against the same server twice, 64 clients, 16
/// commands pipelined: `SET key v NX PX 3000` on random keys (the
/// ceiling: each command creates a key with a TTL, the work of a claim),
/// then on one key (each refused after the first: the work of a
/// duplicate). The fresh-key run counts the keys the server gained, to
/// show that it wrote them.
pub(crate) async fn redis_benchmark(url: &str, requests: u64) -> Result<Ceiling, BenchError> {
    let client = redis::Client::open(url)?;
    let mut con = client.get_multiplexed_async_connection().await?;
    let before = dbsize(&mut con).await?;
    let (command, ops_per_s) = run_redis_benchmark(&client, requests, FRESH_KEY).await?;
    let keys_gained = dbsize(&mut con).await? - before;
    let (one_key_command, one_key_ops_per_s) =
        run_redis_benchmark(&client, requests, ONE_KEY).await?;
    Ok(Ceiling {
        command,
        ops_per_s,
        keys_gained,
        one_key_command,
        one_key_ops_per_s,
    })
}

/// One `redis-benchmark` run of `SET key v NX PX 3000`: the command line
/// (password left out) and the requests per second it reported.
async fn run_redis_benchmark(
    client: &redis::Client,
    requests: u64,
    key: &str,
) -> Result<(String, f64), BenchError> {
    let info = client.get_connection_info();
    let redis::ConnectionAddr::Tcp(host, port) = info.addr() else {
        return Err(BenchError::Ceiling("needs a plain TCP address".into()));
    };
    let settings = info.redis_settings();
    let mut args: Vec<String> = [
        "-h",
        host,
        "-p",
        &port.to_string(),
        "-c",
        "64",
        "-P",
        "16",
        "-n",
        &requests.to_string(),
        "-r",
        "100000000",
        "--dbnum",
        &settings.db().to_string(),
        "--csv",
    ]
    .map(str::to_owned)
    .to_vec();
    let shown = args.join(" ");
    if let Some(p) = settings.password() {
        args.push("-a".into());
        args.push(p.to_owned());
    }
    let command = ["SET", key, "v", "NX", "PX", "3000"];
    let out = tokio::process::Command::new("redis-benchmark")
        .args(&args)
        .args(command)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| BenchError::Ceiling(format!("not run: {e}")))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let ops = stdout
        .lines()
        .rev()
        .find_map(|l| {
            let mut fields = l.split(',').map(|f| f.trim().trim_matches('"'));
            let name = fields.next()?;
            name.starts_with("SET")
                .then(|| fields.next()?.parse::<f64>().ok())?
        })
        .ok_or_else(|| {
            BenchError::Ceiling(format!(
                "no figure: {} {}",
                stdout.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        })?;
    Ok((
        format!("redis-benchmark {shown} {}", command.join(" ")),
        ops,
    ))
}

#[cfg(test)]
mod tests {
    use super::{Settle, expiring_keys, redis_benchmark, sum_expires};
    use norepeat_testkit::RedisServer;

    /// A row waits for the keys of the rows before it: the wait cannot end
    /// while more of them than the slack are alive, and does end once they
    /// have expired.
    #[tokio::test]
    async fn a_row_waits_until_the_keys_before_it_have_expired() {
        let redis = RedisServer::start().await;
        let mut con = redis.connection().await;
        let mut settle = Settle::new(&redis.url()).await.unwrap();
        let mut pipe = redis::pipe();
        for i in 0..(Settle::SLACK + 3_000) {
            pipe.cmd("SET")
                .arg(format!("row-key-{i}"))
                .arg(1)
                .arg("PX")
                .arg(400)
                .ignore();
        }
        let () = pipe.query_async(&mut con).await.unwrap();
        assert!(expiring_keys(&mut con).await.unwrap() > Settle::SLACK);

        settle.wait("next-row").await.unwrap();
        let left = expiring_keys(&mut con).await.unwrap();
        assert!(left <= Settle::SLACK, "{left} keys with a TTL left");
    }

    /// The ceiling creates a key per command, as a claim does (its first
    /// version named its key `__rand_key__`, which `redis-benchmark` does
    /// not replace: every `SET` after the first was refused, and the
    /// "ceiling" measured duplicates). The one-key run adds one key.
    #[tokio::test]
    async fn the_ceiling_creates_a_key_per_command() {
        let redis = RedisServer::start().await;
        let ceiling = redis_benchmark(&redis.url(), 20_000).await.unwrap();
        assert!(ceiling.ops_per_s > 0.0 && ceiling.one_key_ops_per_s > 0.0);
        // 20,000 random picks among 10^8 keys: a few collide at most.
        assert!(
            ceiling.keys_gained > 19_000,
            "the fresh-key run gained {} keys",
            ceiling.keys_gained
        );
        let mut con = redis.connection().await;
        let keys: i64 = redis::cmd("DBSIZE").query_async(&mut con).await.unwrap();
        assert!(
            keys <= ceiling.keys_gained + 1,
            "the one-key run wrote more than its one key: {keys} keys, {} from the fresh-key run",
            ceiling.keys_gained
        );
        assert!(
            ceiling.command.contains("__rand_int__"),
            "{}",
            ceiling.command
        );
    }

    #[test]
    fn expiring_keys_are_summed_over_every_database() {
        let info = "# Keyspace\r\ndb0:keys=10,expires=7,avg_ttl=100\r\ndb3:keys=5,expires=2,avg_ttl=9,subexpiry=0\r\n";
        assert_eq!(sum_expires(info), 9);
        assert_eq!(sum_expires("# Keyspace\r\n"), 0);
    }
}
