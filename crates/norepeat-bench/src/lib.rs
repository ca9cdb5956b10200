//! `norepeat bench`: measure the guards against the store in use.
//!
//! Every row drives the library directly with many concurrent tasks (64 by
//! default) for a fixed time after a warm-up, records each operation's
//! latency, and reads the process's CPU time around the measured window:
//!
//! | row | one operation |
//! |---|---|
//! | `token.issue` | sign a repeat token (no store) |
//! | `redis.raw` | plain redis-rs `SET key 1 NX PX 3000` of a fresh key, as many connections as the store holds, used in turn (one Redis only): the yardstick |
//! | `token.consume` | verify a fresh token and record its use (`SET NX PX`); issuing it is outside the timed part |
//! | `fingerprint.acquire` | a new fingerprint: `SET NX PX GET`, admitted, held |
//! | `fingerprint.duplicate` | a held fingerprint again: the same command, rejected with its `Retry-After` |
//! | `fingerprint.acquire.cluster` | with `--cluster URL,URL,...`: `fingerprint.acquire` on a `ClusterStore` of those nodes (its calls batched per master) |
//! | `fingerprint.acquire.replicas0`, `.replicas1` | with `--replicas`: `fingerprint.acquire` on a master with one replica (two private `redis-server`s), through `?replicas=0` and `?replicas=1` |
//! | `idempotency.claim` | a new `Idempotency-Key` through the layer, timed until its handler is entered; handlers are held to the row's end (at most 2 s), then released |
//! | `idempotency.store_cycle` | the yardstick of `cycle`: its claim (`put_if_absent`) and completion (`replace_if_equals`) at the store, no layer |
//! | `idempotency.cycle` | a new key through the layer: claimed, handled (201, 64-byte body), completed, the response read |
//! | `idempotency.replay` | a key whose record is complete: the stored response replayed |
//! | `ratelimit.gcra` | one GCRA decision (one script by `EVALSHA`) |
//! | `http.unguarded` | `POST /orders` over loopback to a trivial axum route, keep-alive, a unique body each |
//! | `http.guarded` | the same route behind `FingerprintLayer`, the same load generator, the same run |
//! | `http.handrolled` | the same route with the guard written by hand in the handler: `SET key NX PX` through plain redis-rs, 409 when taken (one Redis; on the memory store, a `Mutex<HashMap>` by hand) |
//! | `gateway.direct`, `gateway.nginx`, `gateway.passthrough` | `GET` from a load generator in a process of its own (64 keep-alive connections, 2 threads) to a trivial backend: directly, through NGINX's `proxy_pass` (as many workers as the gateway), through `norepeat-gateway` unguarded (see `rows::gateway`) |
//! | `gateway.nginx_post`, `gateway.nginx_lua`, `gateway.guarded` | the same load, `POST` with a new body each: through NGINX, through NGINX with the fingerprint guard written in Lua (`SET NX PX` on the same Redis), through a fingerprint gateway |
//! | `gateway.idempotent_proxy`, `gateway.idempotency` | `POST` with a new `Idempotency-Key` each, through `idempotent-proxy-server` 1.2.2 on the same Redis, through an idempotency gateway |
//! | `gateway.idempotent_proxy_replay`, `gateway.replay` | `POST` with one completed key a connection: each answered from its record, by each of the two |
//! | `gateway.before.*` | with `--gateway-before PATH`: `passthrough`, `guarded` and `idempotency` on that earlier build of the gateway, in the same run |
//! | `gateway.inproc.*` | the earlier measure: `POST` driven from the bench process itself, directly, through the gateway unguarded and guarded, through nginx |
//! | `idempotency.cycle.postgres`, `idempotency.replay.postgres` | with `--database postgres://...`: `idempotency.cycle` and `idempotency.replay` with the records in a `PgStore` table |
//! | `idempotency.cycle.sqlite`, `idempotency.replay.sqlite` | with `--database sqlite://FILE` or `--sql-rows` (a temporary file): the same on a `SqliteStore` in WAL mode |
//!
//! The SQL rows run after the others, each database in a table of the
//! run's own (`norepeat_bench_<run>`, migrated first, dropped after); the
//! default run has none of them.
//!
//! On one Redis, each row starts once the keys the rows before it wrote
//! have expired and been reclaimed (every row that writes many keys gives
//! them a 3 s TTL, as `redis.raw` does), so that no row pays for another's
//! expiry in the server.
//!
//! `--rounds N` runs every row N times, all rows in turn each round (a
//! gateway row beside its anchor), and reports each row's median figures
//! with the range of its rate, and each ratio as the median of the
//! rounds' ratios (each taken within its round), with their range: on a
//! shared machine one run's ratio is noise.
//!
//! On one Redis it also measures the memory a fingerprint key, an
//! in-progress and a completed idempotency record take (on a private
//! `redis-server` when one can be started, see `probe`) and the store's
//! ceiling (`redis-benchmark` running `SET key v NX PX 3000` with
//! `-c 64 -P 16` on fresh keys, and on one key for reference), and reports
//! the ratios named in BENCHMARKS.md.
//!
//! The parts: `args` (options), `harness` (load generator,
//! percentiles, CPU time), `load` (the gateway rows' load generator, a
//! process of its own), `rows` (one function per row), `probe`
//! (Redis `INFO`, memory per key, `redis-benchmark`), `report` (table and
//! JSON), `error`.

mod args;
mod error;
mod harness;
mod load;
mod private_redis;
mod probe;
mod redis_info;
mod report;
mod rows;

pub use args::BenchArgs;
pub use error::BenchError;
pub use load::SelfCommand;
pub use report::{BenchResult, Ceiling, MemoryResult, Report};
pub use rows::RESULT_NAMES;
pub use rows::sql::{POSTGRES_NAMES, SQLITE_NAMES};

use harness::Load;
use indicatif::{ProgressBar, ProgressStyle};
use norepeat::store::{AnyStore, KeyValueStore, MemoryStore};
use std::time::Duration;

/// Runs the bench and prints its report. `me` is how to start this bench
/// again: the `gateway.*` rows run their load generator as a process of
/// its own (see `load`).
///
/// # Errors
/// When the store cannot be reached or a row gets an answer it does not
/// measure.
///
/// ```no_run
/// use clap::Parser;
/// use norepeat_bench::{BenchArgs, SelfCommand};
///
/// #[derive(Parser)]
/// struct Cli {
///     #[command(flatten)]
///     bench: BenchArgs,
/// }
///
/// # async fn demo() -> Result<(), norepeat_bench::BenchError> {
/// let cli = Cli::parse_from(["norepeat-bench", "--quick", "--only", "token.issue"]);
/// norepeat_bench::run(cli.bench, &SelfCommand::current(&[])?).await
/// # }
/// ```
pub async fn run(args: BenchArgs, me: &SelfCommand) -> Result<(), BenchError> {
    if let Some(spec) = &args.load_generator {
        return load::serve(spec).await;
    }
    let report = measure_all(&args, me).await?;
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.table());
    }
    Ok(())
}

/// Measures every row, the memory per key and the ceiling.
///
/// # Errors
/// As [`run`].
pub async fn measure_all(args: &BenchArgs, me: &SelfCommand) -> Result<Report, BenchError> {
    let url = args.redis_url.as_deref().filter(|u| !u.is_empty());
    let sql_targets = rows::sql::Target::from_args(&args.databases, args.sql_rows)?;
    let store = AnyStore::from_url(url).await?;
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

    let steps = RESULT_NAMES.len() * usize::from(args.rounds) + sql_targets.len() + 2;
    let bar = ProgressBar::new(steps as u64).with_style(
        ProgressStyle::with_template("{spinner} bench {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));

    // Memory first, while the server holds no keys of this run.
    bar.set_message("redis memory per key");
    let only = !args.only.is_empty();
    let memory = match (single_redis, url) {
        _ if only => Err("skipped (--only)".to_owned()),
        (true, Some(u)) => Ok(memory(u, args, run, &load).await?),
        _ => Err(format!("not measured on a {} store", store.kind())),
    };
    bar.inc(1);

    // On one Redis every row starts once the keys of the rows before it
    // are gone (see `probe::Settle`); not in the tests' millisecond runs.
    let mut settle = match (single_redis, url) {
        (true, Some(u)) if args.duration_ms.is_none() => Some(probe::Settle::new(u).await?),
        _ => None,
    };
    let named = |p: &Option<std::path::PathBuf>| p.clone().filter(|p| !p.as_os_str().is_empty());
    let programs = rows::Programs {
        gateway: named(&args.gateway_bin),
        gateway_before: named(&args.gateway_before_bin),
        nginx: named(&args.nginx_bin),
        idempotent_proxy: named(&args.idempotent_proxy_bin),
    };
    let wants = |row: &str| !only || args.only.iter().any(|o| o == row);
    let pair = if args.replicas
        && (wants("fingerprint.acquire.replicas0") || wants("fingerprint.acquire.replicas1"))
    {
        bar.set_message("starting a master and its replica");
        Some(rows::ReplicaPair::start().await?)
    } else {
        None
    };
    let mut rounds = Vec::with_capacity(usize::from(args.rounds));
    for round in 0..args.rounds {
        // Each round writes keys and bodies of its own.
        let run = run.wrapping_add(u64::from(round));
        let mut results = Vec::with_capacity(RESULT_NAMES.len());
        for name in RESULT_NAMES {
            if only && !args.only.iter().any(|o| o == name) {
                continue;
            }
            if let Some(s) = &mut settle {
                bar.set_message(format!("{name}: waiting for earlier keys to expire"));
                let waited = s.wait(name).await?;
                tracing::debug!(
                    row = name,
                    waited_ms = waited.as_millis(),
                    "earlier keys expired"
                );
            }
            bar.set_message(if args.rounds > 1 {
                format!("round {} of {}: {name}", round + 1, args.rounds)
            } else {
                name.to_owned()
            });
            // The memory store evicts early once full (by design): give each
            // row its own, so one row's flood of keys does not evict another's.
            let store = fresh(&store);
            let cx = rows::RowCtx {
                store: &store,
                load: &load,
                run,
                url,
                cluster: &args.cluster,
                replicated: pair.as_ref(),
                me,
                programs: &programs,
            };
            if let Some(s) = rows::row(name, &cx).await? {
                results.push(BenchResult::of(name, &s));
            }
            bar.inc(1);
        }
        rounds.push(results);
    }
    // The SQL rows and their figures belong to the first round.
    let mut results = rounds.first().cloned().unwrap_or_default();

    // The SQL rows after the Redis ones, before the ceiling.
    for target in &sql_targets {
        bar.set_message(target.names()[0]);
        for (name, s) in rows::sql::rows(target, &load, run).await? {
            results.push(BenchResult::of(name, &s));
        }
        bar.inc(1);
    }

    // The ceiling last: its keys expire over the next seconds and would
    // load the server during the rows.
    bar.set_message("redis-benchmark ceiling");
    let ceiling = match (single_redis, url) {
        (true, Some(_)) if args.no_ceiling => Err("skipped (--no-ceiling)".to_owned()),
        _ if only => Err("skipped (--only)".to_owned()),
        (true, Some(u)) => {
            let requests = if args.duration_ms.is_some() {
                20_000
            } else if args.quick {
                300_000
            } else {
                1_000_000
            };
            probe::redis_benchmark(u, requests)
                .await
                .map_err(|e| e.to_string())
        }
        _ => Err(format!("not measured on a {} store", store.kind())),
    };
    bar.inc(1);
    bar.finish_and_clear();

    if let Some(first) = rounds.first_mut() {
        *first = results;
    }
    Ok(Report::of_rounds(
        (
            store.kind(),
            url.map(error::redact),
            load.concurrency,
            duration,
        ),
        rounds,
        memory,
        ceiling,
    ))
}

/// Memory per key on a private `redis-server` (the same binary as the
/// machine's, empty, nothing else writing), or on the `--redis` server
/// when none can be started or `--memory-on-target` asks for it.
async fn memory(
    url: &str,
    args: &BenchArgs,
    run: u64,
    load: &Load,
) -> Result<MemoryResult, BenchError> {
    let private = if args.memory_on_target {
        None
    } else {
        match private_redis::PrivateRedis::start().await {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!(error = %e, "measuring memory on the --redis server instead");
                None
            }
        }
    };
    let (at, server) = match &private {
        Some(p) => (p.url.as_str(), "private redis-server".to_owned()),
        None => (url, "the --redis server".to_owned()),
    };
    probe::memory_per_key(at, server, run, args.memory_keys, load).await
}

/// The same Redis, or a new memory store.
fn fresh(store: &AnyStore) -> AnyStore {
    match store {
        AnyStore::Memory(_) => AnyStore::Memory(MemoryStore::default()),
        other => other.clone(),
    }
}
