//! `norepeat bench --only gateway.*`: the gateway rows (a trivial backend
//! directly, through `norepeat-gateway` unguarded, with a fingerprint guard
//! and with an idempotency guard, loaded from a process of its own; and the
//! in-process `gateway.inproc.*` rows) are measured in one run on memory and
//! on a private Redis, with their ratios. The nginx rows are left out here
//! (nginx may be missing). Speed is never asserted: only that each row ran and
//! measured something. The gateway binary is found next to `norepeat-bench`, as
//! a workspace build puts it (`cargo build -p norepeat-gateway` when
//! running these alone).

use norepeat_testkit::RedisServer;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_norepeat-bench");

const ROWS: [&str; 7] = [
    "gateway.direct",
    "gateway.passthrough",
    "gateway.guarded",
    "gateway.idempotency",
    "gateway.inproc.direct",
    "gateway.inproc.passthrough",
    "gateway.inproc.guarded",
];

const RATIOS: [&str; 2] = [
    "gateway_passthrough_over_direct",
    "gateway_guarded_over_passthrough",
];

fn bench(extra: &[&str]) -> Value {
    let gateway = std::path::Path::new(BIN).with_file_name("norepeat-gateway");
    assert!(
        gateway.is_file(),
        "{} is missing: build it first (cargo build -p norepeat-gateway)",
        gateway.display()
    );
    let mut cmd = std::process::Command::new(BIN);
    cmd.args(["--quick", "--json", "--duration-ms", "250"]);
    for row in ROWS {
        cmd.args(["--only", row]);
    }
    let out = cmd
        .args(extra)
        .env_remove("REDIS_URL")
        .env_remove("NOREPEAT_GATEWAY_BIN")
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {stdout}\n{stderr}");
    let json: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {stdout}"));
    let results = json["results"].as_array().unwrap();
    for row in ROWS {
        let r = results
            .iter()
            .find(|r| r["name"] == row)
            .unwrap_or_else(|| panic!("{row} missing in {json}\n{stderr}"));
        let ops = r["ops_per_s"].as_f64().unwrap();
        assert!(ops > 0.0, "{row}: {r}");
        assert!(r["p50_us"].as_f64().unwrap() > 0.0, "{row}: {r}");
    }
    assert_eq!(results.len(), ROWS.len(), "only the rows asked for: {json}");
    for ratio in RATIOS {
        let v = json["ratios"][ratio].as_f64();
        assert!(v.is_some_and(|v| v > 0.0), "ratios.{ratio} in {json}");
    }
    // Each proxy row says what the proxy process spent.
    for row in [
        "gateway.passthrough",
        "gateway.guarded",
        "gateway.idempotency",
        "gateway.inproc.passthrough",
        "gateway.inproc.guarded",
    ] {
        assert!(
            stderr.contains(&format!("bench: {row}: the proxy process used")),
            "{row}: {stderr}"
        );
    }
    json
}

/// The `ops` of row `name`.
fn ops(json: &Value, name: &str) -> u64 {
    json["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap()["ops"]
        .as_u64()
        .unwrap()
}

#[test]
fn the_gateway_rows_on_memory() {
    let json = bench(&[]);
    assert_eq!(json["store"], "memory");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_rows_on_redis() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    let json = tokio::task::spawn_blocking(move || bench(&["--redis", &url]))
        .await
        .unwrap();
    assert_eq!(json["store"], "redis");
    // The guarded row kept its fingerprints in this Redis (one command a
    // request; the other rows send none), each with a TTL.
    let guarded = ops(&json, "gateway.guarded");
    let mut con = redis.connection().await;
    let stats: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut con)
        .await
        .unwrap();
    let processed: u64 = stats
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        processed >= guarded,
        "{processed} commands for {guarded} guarded requests"
    );
    // Every measured idempotency request claimed a key of its own (kept
    // 60 s): a repeated key would have been a replay, and no new record.
    let idempotency = ops(&json, "gateway.idempotency");
    let keys: u64 = redis::cmd("DBSIZE").query_async(&mut con).await.unwrap();
    assert!(
        keys >= idempotency,
        "{keys} keys for {idempotency} idempotency requests"
    );
    assert_eq!(redis.keys_without_ttl().await, Vec::<String>::new());
    // This Redis runs here: the guarded rows say what it spent, and what
    // the whole machine did, per request.
    for row in ["gateway.guarded", "gateway.idempotency"] {
        let r = json["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == row)
            .unwrap();
        assert!(
            r["store_cpu_us_per_op"].as_f64().is_some_and(|v| v >= 0.0),
            "{r}"
        );
        assert!(
            r["machine_cpu_us_per_op"].as_f64().is_some_and(|v| v > 0.0),
            "{r}"
        );
    }
}
