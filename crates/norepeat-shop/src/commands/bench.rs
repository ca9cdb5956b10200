//! `norepeat bench`: measure the guards against the store in use.
//!
//! Every row drives the library directly with many concurrent tasks (64 by
//! default) over the store client's one multiplexed connection, for a fixed
//! time after a warm-up, and records each operation's latency:
//!
//! | row | one operation |
//! |---|---|
//! | `token.issue` | sign a repeat token (no store) |
//! | `token.consume` | verify a fresh token and record its use (`SET NX PX`); issuing it is outside the timed part |
//! | `fingerprint.acquire` | a new fingerprint: `SET NX PX GET`, admitted, held |
//! | `fingerprint.duplicate` | a held fingerprint again: the same command, rejected with its `Retry-After` |
//! | `idempotency.replay` | a request through the `Idempotency-Key` layer whose record is complete: one read, the stored response replayed |
//! | `ratelimit.gcra` | one GCRA decision (one script by `EVALSHA`) |
//! | `http.unguarded` | `POST /orders` over loopback to a trivial axum route, keep-alive, a unique body each |
//! | `http.guarded` | the same route behind `NoRepeatLayer::fingerprint`, the same load generator, the same run |
//!
//! On one Redis it also measures the memory a fingerprint key takes
//! (`INFO memory` before and after writing many through the guard) and the
//! store's ceiling for one-round-trip decisions (`redis-benchmark` running
//! `SET key v NX PX 3000` with `-c 64 -P 16`), and prints the ratios named
//! in BENCHMARKS.md.

use axum::Router;
use axum::routing::post;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use indicatif::{ProgressBar, ProgressStyle};
use norepeat::fingerprint::Fingerprint;
use norepeat::guard::{FingerprintGuard, NoRepeatLayer, TokenGuard};
use norepeat::idempotency::IdempotencyLayer;
use norepeat::ratelimit::{Algorithm, Quota, RateLimiter};
use norepeat::store::{AnyStore, MemoryStore};
use norepeat::token::TokenSigner;
use serde::Serialize;
use serde_json::{Value, json};
use std::convert::Infallible;
use std::fmt::Write as _;
use std::future::Future;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tower::{Layer, ServiceExt};

/// The bench's options.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Store to measure (`redis://...`, `redis+cluster://...`); default memory.
    #[arg(long = "redis", env = "REDIS_URL")]
    pub redis_url: Option<String>,
    /// Finish within 60 s.
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Concurrent tasks driving each row.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Measured time per row in milliseconds (overrides the mode's; the
    /// warm-up is a fifth of it). For tests.
    #[arg(long, hide = true)]
    pub duration_ms: Option<u64>,
    /// Fingerprint keys written to measure Redis memory per key.
    #[arg(long, default_value_t = 100_000, hide = true)]
    pub memory_keys: usize,
    /// Skip the `redis-benchmark` ceiling.
    #[arg(long)]
    pub no_ceiling: bool,
}

/// The names every report carries, in order.
pub const RESULT_NAMES: [&str; 8] = [
    "token.issue",
    "token.consume",
    "fingerprint.acquire",
    "fingerprint.duplicate",
    "idempotency.replay",
    "ratelimit.gcra",
    "http.unguarded",
    "http.guarded",
];

/// One row of the report.
#[derive(Debug, Clone, Serialize)]
pub struct BenchResult {
    /// What was measured (see the module docs).
    pub name: &'static str,
    /// Operations completed per second over the measured time.
    pub ops_per_s: f64,
    /// Median latency of one operation, in microseconds.
    pub p50_us: f64,
    /// 99th-percentile latency, in microseconds.
    pub p99_us: f64,
    /// Operations measured.
    pub ops: u64,
}

/// Redis memory taken by fingerprint keys.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryResult {
    /// `used_memory` growth divided by the keys written.
    pub bytes_per_fingerprint_key: f64,
    /// Keys written through the guard.
    pub keys: u64,
    /// Keys the server gained meanwhile (`DBSIZE`), a check that nothing
    /// else wrote or expired much.
    pub dbsize_delta: i64,
}

/// The `redis-benchmark` ceiling.
#[derive(Debug, Clone, Serialize)]
pub struct Ceiling {
    /// The command line run.
    pub command: String,
    /// Requests per second it reported.
    pub ops_per_s: f64,
}

/// Runs the bench and prints its report.
///
/// # Errors
/// When the store cannot be reached.
pub async fn run(args: BenchArgs) -> Result<(), String> {
    let report = measure_all(&args).await?;
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.table());
    }
    Ok(())
}

/// What one run found.
#[derive(Debug, Clone)]
pub struct Report {
    store: &'static str,
    url: Option<String>,
    concurrency: usize,
    duration: Duration,
    results: Vec<BenchResult>,
    memory: Option<MemoryResult>,
    ceiling: Result<Ceiling, String>,
}

struct Load {
    concurrency: usize,
    warmup: Duration,
    duration: Duration,
}

async fn measure_all(args: &BenchArgs) -> Result<Report, String> {
    let url = args.redis_url.as_deref().filter(|u| !u.is_empty());
    let store = AnyStore::from_url(url)
        .await
        .map_err(|e| format!("cannot reach the store: {e}"))?;
    let single_redis = matches!(store, AnyStore::Redis(_));
    let duration = Duration::from_millis(
        args.duration_ms
            .unwrap_or(if args.quick { 1_500 } else { 5_000 })
            .max(10),
    );
    let load = Load {
        concurrency: args.concurrency.max(1),
        warmup: duration / 5,
        duration,
    };
    // A per-run random prefix keeps runs against one Redis apart.
    let run: u64 = rand::random();

    let steps = RESULT_NAMES.len() as u64 + 2;
    let bar = ProgressBar::new(steps).with_style(
        ProgressStyle::with_template("{spinner} bench {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));

    // Memory first, while the server holds no keys of this run.
    bar.set_message("redis memory per fingerprint key");
    let memory = match (single_redis, url) {
        (true, Some(u)) => Some(memory_per_key(u, &store, run, args.memory_keys, &load).await?),
        _ => None,
    };
    bar.inc(1);

    let mut results = Vec::with_capacity(RESULT_NAMES.len());
    for name in RESULT_NAMES {
        bar.set_message(name);
        // The memory store evicts early once full (by design): give each
        // row its own, so one row's flood of keys does not evict another's.
        let store = fresh(&store);
        let r = match name {
            "token.issue" => token_issue(&store, &load).await?,
            "token.consume" => token_consume(&store, &load).await?,
            "fingerprint.acquire" => fingerprint_acquire(&store, &load, run).await?,
            "fingerprint.duplicate" => fingerprint_duplicate(&store, &load, run).await?,
            "idempotency.replay" => idempotency_replay(&store, &load, run).await?,
            "ratelimit.gcra" => ratelimit_gcra(&store, &load, run).await?,
            "http.unguarded" => http(&store, &load, run, false).await?,
            _ => http(&store, &load, run, true).await?,
        };
        results.push(r.named(name));
        bar.inc(1);
    }

    // The ceiling last: its keys expire over the next seconds and would
    // load the server during the rows.
    bar.set_message("redis-benchmark ceiling");
    let ceiling = match (single_redis, url) {
        (true, Some(_)) if args.no_ceiling => Err("skipped (--no-ceiling)".to_owned()),
        (true, Some(u)) => {
            let requests = if args.duration_ms.is_some() {
                20_000
            } else if args.quick {
                300_000
            } else {
                1_000_000
            };
            redis_benchmark(u, requests).await
        }
        _ => Err(format!("not measured on a {} store", store_kind(&store))),
    };
    bar.inc(1);
    bar.finish_and_clear();

    Ok(Report {
        store: store_kind(&store),
        url: url.map(redact),
        concurrency: load.concurrency,
        duration,
        results,
        memory,
        ceiling,
    })
}

/// The same Redis, or a new memory store.
fn fresh(store: &AnyStore) -> AnyStore {
    match store {
        AnyStore::Memory(_) => AnyStore::Memory(MemoryStore::default()),
        other => other.clone(),
    }
}

fn store_kind(store: &AnyStore) -> &'static str {
    norepeat::store::Store::kind(store)
}

/// The URL without its password.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        _ => url.to_owned(),
    }
}

/// Latencies and throughput of one row, before it is named.
struct Sample {
    ops_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    ops: u64,
}

impl Sample {
    fn named(self, name: &'static str) -> BenchResult {
        BenchResult {
            name,
            ops_per_s: self.ops_per_s,
            p50_us: self.p50_us,
            p99_us: self.p99_us,
            ops: self.ops,
        }
    }
}

/// Runs `op` from `load.concurrency` tasks: a warm-up, then the measured
/// time. `op(id)` is called outside the timed part (it prepares the
/// operation, with `id` unique within the row); the future it returns is
/// the timed operation.
async fn measure<F, Fut>(load: &Load, op: F) -> Result<Sample, String>
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    let op = Arc::new(op);
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now() + load.warmup;
    let end = start + load.duration;
    let mut tasks = Vec::with_capacity(load.concurrency);
    for _ in 0..load.concurrency {
        let op = Arc::clone(&op);
        let next = Arc::clone(&next);
        tasks.push(tokio::spawn(async move {
            let mut lat: Vec<u32> = Vec::with_capacity(16 * 1024);
            let mut last = start;
            loop {
                let id = next.fetch_add(1, Ordering::Relaxed);
                let fut = op(id);
                let t0 = Instant::now();
                if t0 >= end {
                    break;
                }
                fut.await?;
                let t1 = Instant::now();
                if t0 >= start {
                    lat.push(u32::try_from((t1 - t0).as_nanos()).unwrap_or(u32::MAX));
                    last = last.max(t1);
                }
                // CPU-only rows never wait: let the other tasks (and the
                // timer) run.
                tokio::task::coop::consume_budget().await;
            }
            Ok::<_, String>((lat, last))
        }));
    }
    let mut all: Vec<u32> = Vec::new();
    let mut last = start;
    for t in tasks {
        let (lat, l) = t.await.map_err(|e| format!("bench task failed: {e}"))??;
        all.extend_from_slice(&lat);
        last = last.max(l);
    }
    if all.is_empty() {
        return Err("no operation completed in the measured time".into());
    }
    all.sort_unstable();
    let elapsed = (last - start).as_secs_f64().max(1e-9);
    let pct = |p: f64| {
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let rank = ((p * all.len() as f64).ceil() as usize).clamp(1, all.len());
        f64::from(all[rank - 1]) / 1_000.0
    };
    #[allow(clippy::cast_precision_loss)]
    let ops_per_s = all.len() as f64 / elapsed;
    Ok(Sample {
        ops_per_s,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        ops: all.len() as u64,
    })
}

/// A fingerprint unique to this run, `purpose` and `id`. The store key is
/// made of the first 16 bytes.
fn fingerprint(run: u64, purpose: u8, id: u64) -> Fingerprint {
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&run.to_le_bytes());
    b[8] = purpose;
    b[9..16].copy_from_slice(&id.to_le_bytes()[..7]);
    Fingerprint(b)
}

async fn token_issue(store: &AnyStore, load: &Load) -> Result<Sample, String> {
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

async fn token_consume(store: &AnyStore, load: &Load) -> Result<Sample, String> {
    let guard = Arc::new(
        TokenGuard::new(store.clone(), TokenSigner::random()).ttl(Duration::from_secs(10)),
    );
    measure(load, move |_| {
        let g = Arc::clone(&guard);
        let token = g.issue("bench-user").token;
        async move {
            g.consume("bench-user", &token)
                .await
                .map_err(|p| format!("token.consume refused: {}", p.code.as_str()))
        }
    })
    .await
}

async fn fingerprint_acquire(store: &AnyStore, load: &Load, run: u64) -> Result<Sample, String> {
    let guard = Arc::new(FingerprintGuard::new(store.clone()));
    measure(load, move |id| {
        let g = Arc::clone(&guard);
        let fp = fingerprint(run, 1, id);
        async move {
            let lease = g
                .acquire(&fp)
                .await
                .map_err(|p| format!("fingerprint.acquire refused: {}", p.code.as_str()))?;
            if !lease.is_held() {
                return Err("fingerprint.acquire: the store failed (admitted fail-open)".into());
            }
            lease.finish(true).await;
            Ok(())
        }
    })
    .await
}

async fn fingerprint_duplicate(store: &AnyStore, load: &Load, run: u64) -> Result<Sample, String> {
    let hold = load.warmup + load.duration + Duration::from_secs(30);
    let guard = Arc::new(FingerprintGuard::new(store.clone()).window(hold));
    let held = load.concurrency as u64;
    for id in 0..held {
        let lease = guard
            .acquire(&fingerprint(run, 2, id))
            .await
            .map_err(|p| format!("fingerprint.duplicate setup: {}", p.code.as_str()))?;
        lease.finish(true).await;
    }
    measure(load, move |id| {
        let g = Arc::clone(&guard);
        let fp = fingerprint(run, 2, id % held);
        async move {
            match g.acquire(&fp).await {
                Err(p) if p.code.as_str() == "duplicate_submission" => Ok(()),
                Err(p) => Err(format!("fingerprint.duplicate: {}", p.code.as_str())),
                Ok(_) => Err("fingerprint.duplicate: a held fingerprint was admitted".into()),
            }
        }
    })
    .await
}

async fn idempotency_replay(store: &AnyStore, load: &Load, run: u64) -> Result<Sample, String> {
    let inner = tower::service_fn(|_req: Request<Full<Bytes>>| async {
        let mut res = Response::new(Full::new(Bytes::from_static(br#"{"paymentId":"p1"}"#)));
        *res.status_mut() = StatusCode::CREATED;
        res.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        Ok::<_, Infallible>(res)
    });
    let svc = IdempotencyLayer::new(store.clone())
        .route("/payments")
        .retention(Duration::from_secs(120))
        .layer(inner);
    let key = format!("bench-{run:016x}");
    let request = move || {
        Request::post("/payments")
            .header("x-user-id", "bench-user")
            .header("idempotency-key", key.as_str())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(
                br#"{"orderId":"o1","amount":1999}"#,
            )))
            .map_err(|e| e.to_string())
    };
    let Ok(first) = svc.clone().oneshot(request()?).await;
    if first.status() != StatusCode::CREATED {
        return Err(format!("idempotency.replay setup: {}", first.status()));
    }
    let _ = first.into_body().collect().await;
    measure(load, move |_| {
        let svc = svc.clone();
        let req = request();
        async move {
            let Ok(res) = svc.oneshot(req?).await;
            if res
                .headers()
                .get("idempotent-replayed")
                .map(|v| v.as_bytes())
                != Some(b"true")
            {
                return Err(format!(
                    "idempotency.replay: not a replay ({})",
                    res.status()
                ));
            }
            let body = res
                .into_body()
                .collect()
                .await
                .map_err(|e| format!("idempotency.replay body: {e}"))?;
            std::hint::black_box(body);
            Ok(())
        }
    })
    .await
}

async fn ratelimit_gcra(store: &AnyStore, load: &Load, run: u64) -> Result<Sample, String> {
    let rate = NonZeroU32::new(1_000_000).ok_or("zero rate")?;
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
                .map_err(|e| format!("ratelimit.gcra: {e}"))?;
            std::hint::black_box(d);
            Ok(())
        }
    })
    .await
}

async fn created(_body: Bytes) -> (StatusCode, &'static str) {
    (StatusCode::CREATED, r#"{"created":true}"#)
}

/// The trivial route over loopback, without or with the fingerprint guard,
/// driven by one keep-alive client from every task, each request a new
/// body (so each guarded one is a new fingerprint).
async fn http(store: &AnyStore, load: &Load, run: u64, guarded: bool) -> Result<Sample, String> {
    let app = if guarded {
        let guard = FingerprintGuard::new(store.clone());
        Router::new().route(
            "/orders",
            post(created).layer(NoRepeatLayer::fingerprint(guard).route("/orders")),
        )
    } else {
        Router::new().route("/orders", post(created))
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("cannot listen on loopback: {e}"))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot listen on loopback: {e}"))?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let client = reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(load.concurrency)
        .build()
        .map_err(|e| format!("http client: {e}"))?;
    let url: Arc<str> = Arc::from(format!("http://{addr}/orders"));
    let tag = if guarded { 'g' } else { 'u' };
    let result = measure(load, move |id| {
        let client = client.clone();
        let url = Arc::clone(&url);
        let body = format!(r#"{{"sku":"SKU-1","quantity":1,"note":"{run:016x}{tag}{id}"}}"#);
        async move {
            let res = client
                .post(&*url)
                .header("x-user-id", "bench-user")
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .map_err(|e| format!("http: {e}"))?;
            let status = res.status();
            let bytes = res.bytes().await.map_err(|e| format!("http body: {e}"))?;
            if status != reqwest::StatusCode::CREATED {
                return Err(format!(
                    "http: answered {status}: {}",
                    String::from_utf8_lossy(&bytes)
                ));
            }
            Ok(())
        }
    })
    .await;
    server.abort();
    result
}

/// `used_memory` from `INFO memory`.
async fn used_memory(con: &mut redis::aio::MultiplexedConnection) -> Result<i64, String> {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(con)
        .await
        .map_err(|e| format!("INFO memory: {e}"))?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "INFO memory has no used_memory".to_owned())
}

async fn dbsize(con: &mut redis::aio::MultiplexedConnection) -> Result<i64, String> {
    redis::cmd("DBSIZE")
        .query_async(con)
        .await
        .map_err(|e| format!("DBSIZE: {e}"))
}

/// Reads `used_memory` until it settles (the server finishes rehashing its
/// tables in the background), at most ~2 s.
async fn settled_memory(con: &mut redis::aio::MultiplexedConnection) -> Result<i64, String> {
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

/// Writes `n` fingerprint keys through the guard (held 5 minutes so none
/// expires meanwhile) and divides the growth of `used_memory` by `n`; then
/// deletes them.
async fn memory_per_key(
    url: &str,
    store: &AnyStore,
    run: u64,
    n: usize,
    load: &Load,
) -> Result<MemoryResult, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("cannot reach the store: {e}"))?;
    let n = n.max(1) as u64;
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
                    return Ok::<_, String>(());
                }
                let lease = guard
                    .acquire(&fingerprint(run, 3, id))
                    .await
                    .map_err(|p| format!("memory: {}", p.code.as_str()))?;
                if !lease.is_held() {
                    return Err("memory: the store failed".into());
                }
                lease.finish(true).await;
            }
        }));
    }
    for t in tasks {
        t.await.map_err(|e| format!("bench task failed: {e}"))??;
    }
    let after = settled_memory(&mut con).await?;
    let keys_after = dbsize(&mut con).await?;
    // Leave nothing behind.
    let mut id = 0;
    while id < n {
        let batch: Vec<String> = (id..(id + 1_000).min(n))
            .map(|i| guard.key_of(&fingerprint(run, 3, i)))
            .collect();
        let _: i64 = redis::cmd("UNLINK")
            .arg(&batch)
            .query_async(&mut con)
            .await
            .map_err(|e| format!("UNLINK: {e}"))?;
        id += 1_000;
    }
    #[allow(clippy::cast_precision_loss)]
    let per_key = (after - before) as f64 / n as f64;
    Ok(MemoryResult {
        bytes_per_fingerprint_key: per_key,
        keys: n,
        dbsize_delta: keys_after - keys_before,
    })
}

/// Runs `redis-benchmark` against the same server: `SET key v NX PX 3000`,
/// 64 clients, 16 commands pipelined, random keys.
async fn redis_benchmark(url: &str, requests: u64) -> Result<Ceiling, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let info = client.get_connection_info();
    let redis::ConnectionAddr::Tcp(host, port) = info.addr() else {
        return Err("redis-benchmark needs a plain TCP address".into());
    };
    let settings = info.redis_settings();
    let mut args: Vec<String> = vec![
        "-h".into(),
        host.clone(),
        "-p".into(),
        port.to_string(),
        "-c".into(),
        "64".into(),
        "-P".into(),
        "16".into(),
        "-n".into(),
        requests.to_string(),
        "-r".into(),
        "100000000".into(),
        "--dbnum".into(),
        settings.db().to_string(),
        "--csv".into(),
    ];
    let shown = args.join(" ");
    if let Some(p) = settings.password() {
        args.push("-a".into());
        args.push(p.to_owned());
    }
    let command = ["SET", "__rand_key__", "v", "NX", "PX", "3000"];
    let out = tokio::process::Command::new("redis-benchmark")
        .args(&args)
        .args(command)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| format!("redis-benchmark not run: {e}"))?;
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
            format!(
                "redis-benchmark gave no figure: {} {}",
                stdout.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })?;
    Ok(Ceiling {
        command: format!("redis-benchmark {shown} {}", command.join(" ")),
        ops_per_s: ops,
    })
}

/// A ratio against its target.
struct Ratio {
    name: &'static str,
    value: Option<f64>,
    target: &'static str,
    met: Option<bool>,
}

impl Report {
    fn find(&self, name: &str) -> Option<f64> {
        self.results
            .iter()
            .find(|r| r.name == name)
            .map(|r| r.ops_per_s)
    }

    fn ratios(&self) -> Vec<Ratio> {
        let ceiling = self.ceiling.as_ref().ok().map(|c| c.ops_per_s);
        let acquire = self
            .find("fingerprint.acquire")
            .zip(ceiling)
            .map(|(a, c)| a / c);
        let http = self
            .find("http.guarded")
            .zip(self.find("http.unguarded"))
            .map(|(g, u)| g / u);
        let bytes = self.memory.as_ref().map(|m| m.bytes_per_fingerprint_key);
        vec![
            Ratio {
                name: "fingerprint.acquire / redis-benchmark",
                value: acquire,
                target: ">= 0.5 (aim 0.7)",
                met: acquire.map(|r| r >= 0.5),
            },
            Ratio {
                name: "http.guarded / http.unguarded",
                value: http,
                target: ">= 0.5 (aim 0.75)",
                met: http.map(|r| r >= 0.5),
            },
            Ratio {
                name: "bytes per fingerprint key",
                value: bytes,
                target: "<= 120 (aim 96)",
                met: bytes.map(|b| b <= 120.0),
            },
        ]
    }

    /// The machine-readable report.
    #[must_use]
    pub fn to_json(&self) -> Value {
        let ratios: serde_json::Map<String, Value> = self
            .ratios()
            .into_iter()
            .map(|r| (r.name.to_owned(), json!(r.value)))
            .collect();
        json!({
            "store": self.store,
            "concurrency": self.concurrency,
            "duration_ms": u64::try_from(self.duration.as_millis()).unwrap_or(u64::MAX),
            "results": self.results,
            "memory": self.memory,
            "ceiling": match &self.ceiling {
                Ok(c) => json!(c),
                Err(why) => json!({ "skipped": why }),
            },
            "ratios": ratios,
        })
    }

    /// The table for people.
    #[must_use]
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "norepeat bench: store {}{}, {} concurrent tasks, {:.1} s per row",
            self.store,
            self.url
                .as_deref()
                .map(|u| format!(" ({u})"))
                .unwrap_or_default(),
            self.concurrency,
            self.duration.as_secs_f64()
        );
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<24} {:>12} {:>10} {:>10}",
            "name", "ops/s", "p50 µs", "p99 µs"
        );
        for r in &self.results {
            let _ = writeln!(
                out,
                "{:<24} {:>12.0} {:>10.1} {:>10.1}",
                r.name, r.ops_per_s, r.p50_us, r.p99_us
            );
        }
        let _ = writeln!(out);
        match &self.ceiling {
            Ok(c) => {
                let _ = writeln!(out, "ceiling: {:.0} ops/s  ({})", c.ops_per_s, c.command);
            }
            Err(why) => {
                let _ = writeln!(out, "ceiling: {why}");
            }
        }
        match &self.memory {
            Some(m) => {
                let _ = writeln!(
                    out,
                    "memory: {:.1} bytes per fingerprint key ({} keys written, DBSIZE +{})",
                    m.bytes_per_fingerprint_key, m.keys, m.dbsize_delta
                );
            }
            None => {
                let _ = writeln!(out, "memory: not measured on a {} store", self.store);
            }
        }
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<40} {:>8}  {:<18} result",
            "ratio", "value", "target"
        );
        for r in self.ratios() {
            let value = r
                .value
                .map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"));
            let met = match r.met {
                Some(true) => "met",
                Some(false) => "MISSED",
                None => "not measured",
            };
            let _ = writeln!(out, "{:<40} {:>8}  {:<18} {met}", r.name, value, r.target);
        }
        out
    }
}
