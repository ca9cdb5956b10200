//! `norepeat bench --quick --json`: the report's shape, on memory and on a
//! private Redis. Speed is never asserted here: only that every row of the
//! contract is present and measured something.

#![allow(clippy::unwrap_used)]

use norepeat_testkit::RedisServer;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_norepeat");

const NAMES: [&str; 8] = [
    "token.issue",
    "token.consume",
    "fingerprint.acquire",
    "fingerprint.duplicate",
    "idempotency.replay",
    "ratelimit.gcra",
    "http.unguarded",
    "http.guarded",
];

fn bench(extra: &[&str]) -> Value {
    let out = std::process::Command::new(BIN)
        .args([
            "bench",
            "--quick",
            "--json",
            "--duration-ms",
            "250",
            "--memory-keys",
            "5000",
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

fn check_results(json: &Value) {
    let results = json["results"].as_array().unwrap();
    for name in NAMES {
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
    }
}

#[test]
fn bench_on_memory() {
    let json = bench(&[]);
    assert_eq!(json["store"], "memory");
    check_results(&json);
    assert!(
        json["memory"].is_null(),
        "no Redis memory on a memory store: {json}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_on_redis() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    let json = tokio::task::spawn_blocking(move || bench(&["--redis", &url]))
        .await
        .unwrap();
    assert_eq!(json["store"], "redis");
    check_results(&json);
    let per_key = json["memory"]["bytes_per_fingerprint_key"]
        .as_f64()
        .unwrap();
    assert!(per_key > 0.0, "{json}");
    // The ceiling is measured when redis-benchmark is installed, and says
    // why not otherwise.
    let ceiling = &json["ceiling"];
    assert!(
        ceiling["ops_per_s"].as_f64().is_some_and(|v| v > 0.0) || ceiling["skipped"].is_string(),
        "{ceiling}"
    );
    assert!(json["ratios"].is_object(), "{json}");
    // Every key the bench wrote expires.
    assert_eq!(redis.keys_without_ttl().await, Vec::<String>::new());
}
