//! `norepeat bench --quick --json`: the report's shape, on memory and on a
//! private Redis. Speed is never asserted here: only that every row of the
//! contract is present and measured something.

use norepeat_testkit::{PgDatabase, RedisServer};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_norepeat-bench");

/// Every row of the contract (`norepeat bench`) on any
/// store (`http.handrolled` with its guard by hand in process on memory);
/// `redis.raw` is measured on Redis only.
const NAMES: [&str; 12] = [
    "token.issue",
    "token.consume",
    "fingerprint.acquire",
    "fingerprint.duplicate",
    "idempotency.claim",
    "idempotency.store_cycle",
    "idempotency.cycle",
    "idempotency.replay",
    "ratelimit.gcra",
    "http.unguarded",
    "http.guarded",
    "http.handrolled",
];

/// The rows measured on one Redis only (plain redis-rs).
const REDIS_ONLY: [&str; 1] = ["redis.raw"];

const RATIOS: [&str; 6] = [
    "fingerprint_acquire_over_raw",
    "token_consume_over_raw",
    "http_guarded_over_unguarded",
    "http_guarded_over_handrolled",
    "idempotency_cycle_over_store_cycle",
    "idempotency_replay_over_raw",
];

const MEMORY: [&str; 3] = [
    "bytes_per_fingerprint_key",
    "bytes_per_idempotency_in_progress",
    "bytes_per_idempotency_completed",
];

fn bench(extra: &[&str]) -> Value {
    let out = std::process::Command::new(BIN)
        .args([
            "--quick",
            "--json",
            "--duration-ms",
            "250",
            "--memory-keys",
            "2000",
        ])
        .args(extra)
        .env_remove("REDIS_URL")
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "bench failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {stdout}"))
}

fn check_results(json: &Value, names: &[&str]) {
    let results = json["results"].as_array().unwrap();
    for &name in names {
        let r = results
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name} missing in {json}"));
        for field in ["ops_per_s", "p50_us", "p99_us"] {
            assert!(r[field].is_number(), "{name}.{field} in {r}");
        }
        assert!(r["ops_per_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(
            r["p50_us"].as_f64().unwrap() <= r["p99_us"].as_f64().unwrap(),
            "{r}"
        );
        // Read from the process's CPU time: at least 0 (10 ms steps).
        assert!(r["cpu_us_per_op"].as_f64().unwrap() >= 0.0, "{r}");
    }
}

#[test]
fn bench_on_memory() {
    let json = bench(&[]);
    assert_eq!(json["store"], "memory");
    check_results(&json, &NAMES);
    let results = json["results"].as_array().unwrap();
    for name in REDIS_ONLY {
        assert!(
            results.iter().all(|r| r["name"] != name),
            "{name} is measured on Redis only: {json}"
        );
    }
    assert!(
        results
            .iter()
            .all(|r| !r["name"].as_str().unwrap().ends_with(".postgres")
                && !r["name"].as_str().unwrap().ends_with(".sqlite")),
        "the SQL rows run only when asked for: {json}"
    );
    assert!(
        json["memory"].is_null(),
        "no Redis memory on a memory store: {json}"
    );
}

/// The SQL rows come only when asked for: SQLite in a temporary file
/// (`--sql-rows`) and PostgreSQL (`--database`, a fresh database), next to
/// the contract's rows, which stay as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_sql_rows() {
    const SQL: [&str; 4] = [
        "idempotency.cycle.sqlite",
        "idempotency.replay.sqlite",
        "idempotency.cycle.postgres",
        "idempotency.replay.postgres",
    ];
    let db = PgDatabase::fresh().await;
    let url = db.url();
    let json = tokio::task::spawn_blocking(move || bench(&["--sql-rows", "--database", &url]))
        .await
        .unwrap();
    assert_eq!(json["store"], "memory");
    check_results(&json, &NAMES);
    check_results(&json, &SQL);
    // The run's table is dropped afterwards.
    let pool = db.pool().await;
    let left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'norepeat_bench_%'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(left, 0, "the bench table was left behind");
    pool.close().await;
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_on_redis() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    let json = tokio::task::spawn_blocking(move || bench(&["--redis", &url]))
        .await
        .unwrap();
    assert_eq!(json["store"], "redis");
    check_results(&json, &NAMES);
    check_results(&json, &REDIS_ONLY);
    for field in MEMORY {
        let bytes = json["memory"][field].as_f64();
        assert!(bytes.is_some_and(|b| b > 0.0), "memory.{field} in {json}");
    }
    // The ceiling is measured when redis-benchmark is installed, and says
    // why not otherwise.
    let ceiling = &json["ceiling"];
    assert!(
        ceiling["ops_per_s"].as_f64().is_some_and(|v| v > 0.0) || ceiling["skipped"].is_string(),
        "{ceiling}"
    );
    // The acquire's share of the ceiling comes with the ceiling.
    let over_ceiling = json["ratios"]["fingerprint_acquire_over_ceiling"].as_f64();
    if ceiling["ops_per_s"].is_number() {
        assert!(over_ceiling.is_some_and(|r| r > 0.0), "{json}");
    } else {
        assert!(
            json["ratios"]["fingerprint_acquire_over_ceiling"].is_null(),
            "{json}"
        );
    }
    for ratio in RATIOS {
        let r = json["ratios"][ratio].as_f64();
        assert!(r.is_some_and(|r| r > 0.0), "ratios.{ratio} in {json}");
    }
    // Every key the bench wrote expires.
    assert_eq!(redis.keys_without_ttl().await, Vec::<String>::new());
}

/// `--only ROW` (repeatable) measures those rows and nothing else: no
/// memory figures, no ceiling, the ratio between them still reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_only_measures_the_rows_it_names() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    let json = tokio::task::spawn_blocking(move || {
        bench(&[
            "--redis",
            &url,
            "--only",
            "fingerprint.acquire",
            "--only",
            "redis.raw",
        ])
    })
    .await
    .unwrap();
    let names: Vec<&str> = json["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["redis.raw", "fingerprint.acquire"], "{json}");
    check_results(&json, &names);
    assert!(json["memory"].is_null(), "{json}");
    assert!(
        json["memory_skipped"].as_str().unwrap().contains("--only"),
        "{json}"
    );
    assert!(
        json["ceiling"]["skipped"]
            .as_str()
            .unwrap()
            .contains("--only"),
        "{json}"
    );
    let r = json["ratios"]["fingerprint_acquire_over_raw"].as_f64();
    assert!(r.is_some_and(|r| r > 0.0), "{json}");
}

/// `--cluster` adds `fingerprint.acquire.cluster`, measured on a real
/// Redis Cluster from the test kit; without it the row is left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_cluster_row_on_a_cluster() {
    let cluster = norepeat_testkit::RedisCluster::start().await;
    let nodes = cluster.node_urls().join(",");
    let json = tokio::task::spawn_blocking(move || {
        bench(&[
            "--cluster",
            &nodes,
            "--only",
            "fingerprint.acquire.cluster",
            "--only",
            "fingerprint.acquire",
        ])
    })
    .await
    .unwrap();
    check_results(
        &json,
        &["fingerprint.acquire.cluster", "fingerprint.acquire"],
    );
    let without = tokio::task::spawn_blocking(|| bench(&["--only", "fingerprint.acquire.cluster"]))
        .await
        .unwrap();
    assert_eq!(without["results"], serde_json::json!([]), "{without}");
}

/// `--replicas` adds `fingerprint.acquire.replicas0` and `.replicas1`,
/// measured side by side on a master with one replica that the bench
/// starts, and their ratio; without it both rows are left out.
#[test]
fn bench_replicas_rows_on_a_master_and_its_replica() {
    let rows = [
        "fingerprint.acquire.replicas0",
        "fingerprint.acquire.replicas1",
    ];
    let mut args = vec!["--replicas"];
    for row in rows {
        args.extend(["--only", row]);
    }
    let json = bench(&args);
    check_results(&json, &rows);
    let ratio = json["ratios"]["replicas1_over_replicas0"].as_f64();
    assert!(ratio.is_some_and(|r| r > 0.0), "{json}");
    let without = bench(&["--only", rows[0], "--only", rows[1]]);
    assert_eq!(without["results"], serde_json::json!([]), "{without}");
}
