//! `norepeat storm`: the naive service shows the incident, every defended
//! row shows none of it; on embedded defaults and on Redis + PostgreSQL,
//! and with the naive shop behind two `norepeat-gateway` processes (the
//! gateway binary is found next to `norepeat`, as a workspace build puts
//! it: `cargo build -p norepeat-gateway` when running these alone).

use norepeat_testkit::{PgDatabase, RedisServer};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_norepeat");

fn storm(extra: &[&str], env: &[(&str, String)]) -> (bool, Value) {
    let (ok, json, _) = storm_logged(extra, env);
    (ok, json)
}

/// [`storm`], and its log lines (JSON) on stderr.
fn storm_logged(extra: &[&str], env: &[(&str, String)]) -> (bool, Value, Vec<Value>) {
    let mut cmd = std::process::Command::new(BIN);
    cmd.args(["storm", "--json", "--requests", "60"])
        .args(extra);
    cmd.env_remove("REDIS_URL")
        .env_remove("DATABASE_URL")
        .env_remove("RUST_LOG")
        .env("NOREPEAT_LOG_FORMAT", "json");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let json: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {stdout}"));
    let logs = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    (out.status.success(), json, logs)
}

/// A successful storm logs no warning or error for the outages it injects
/// on purpose (it printed some 300 beside exit 0): one info line counts
/// them, how many of each.
fn check_logs(logs: &[Value]) {
    let loud: Vec<&Value> = logs
        .iter()
        .filter(|l| l["level"] == "WARN" || l["level"] == "ERROR")
        .collect();
    assert!(
        loud.is_empty(),
        "{} warnings or errors: {loud:?}",
        loud.len()
    );
    let summaries: Vec<&str> = logs
        .iter()
        .filter(|l| l["level"] == "INFO")
        .filter_map(|l| l["fields"]["message"].as_str())
        .filter(|m| m.starts_with("the store outages the storm injected logged"))
        .collect();
    assert_eq!(summaries.len(), 1, "{logs:?}");
    for line in [
        "WARN norepeat::degrade \"store failed: admitting (fail-open)\"",
        "ERROR norepeat::store::breaker \"circuit breaker opened",
    ] {
        assert!(summaries[0].contains(line), "{line} in {}", summaries[0]);
    }
}

/// Checks the rows of a run of `defences` defences (naive among them).
fn check(json: &Value, defences: usize) {
    let rows = json["rows"].as_array().unwrap();
    assert_eq!(
        rows.len(),
        6 * defences,
        "6 scenarios x {defences} defences"
    );
    for r in rows {
        for field in [
            "scenario",
            "defence",
            "sent",
            "expected",
            "created",
            "duplicates",
            "oversold",
            "rejected",
            "p50_ms",
            "p99_ms",
        ] {
            assert!(r.get(field).is_some(), "{field} missing in {r}");
        }
    }
    let naive: Vec<&Value> = rows.iter().filter(|r| r["defence"] == "naive").collect();
    let with_dupes = naive
        .iter()
        .filter(|r| r["duplicates"].as_u64().unwrap() > 0)
        .count();
    assert!(
        with_dupes >= 3,
        "naive rows should show the incident: {naive:?}"
    );
    assert!(
        naive.iter().any(|r| r["oversold"].as_i64().unwrap() > 0),
        "some naive row should oversell: {naive:?}"
    );
    // One token replayed to both instances while the store is down, no
    // bizId: only the business key derived from the token stops it.
    let token_outage: Vec<&Value> = rows
        .iter()
        .filter(|r| r["scenario"] == "token-outage")
        .collect();
    assert_eq!(token_outage.len(), defences);
    for r in token_outage {
        if r["defence"] == "naive" {
            assert!(r["duplicates"].as_u64().unwrap() > 0, "{r}");
        } else {
            assert!(r["rejected"].as_u64().unwrap() > 0, "{r}");
        }
    }
    for r in rows.iter().filter(|r| r["defence"] != "naive") {
        assert_eq!(r["duplicates"], 0, "{r}");
        assert_eq!(r["oversold"], 0, "{r}");
        assert_eq!(
            r["created"], r["expected"],
            "every legitimate order is made: {r}"
        );
    }
}

#[test]
fn storm_on_embedded_defaults() {
    let (ok, json, logs) = storm_logged(&[], &[]);
    // No Redis: the gateway rows are left out.
    check(&json, 4);
    assert!(ok, "exit status must be 0 when every defended row is clean");
    check_logs(&logs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm_on_redis_and_postgres() {
    let redis = RedisServer::start().await;
    let pg = PgDatabase::fresh().await;
    let (redis_url, pg_url) = (redis.url(), pg.url());
    let (ok, json) = tokio::task::spawn_blocking(move || {
        storm(&["--redis", &redis_url, "--database", &pg_url], &[])
    })
    .await
    .unwrap();
    // With a Redis, the gateway rows too.
    check(&json, 5);
    assert!(ok);
    assert_eq!(redis.keys_without_ttl().await, Vec::<String>::new());
}

/// Runs `storm --target` against one shop process on a SQLite file of its
/// own, started with `shop_env` besides its admin token: the exit status
/// and the JSON report. One process: the targets share its memory store
/// (two processes would each have their own, which is what REDIS_URL is for).
async fn storm_against_a_shop(shop_env: &[(&str, &str)]) -> (bool, Value) {
    let db = norepeat_testkit::SqliteFile::new();
    let mut env = vec![
        ("DATABASE_URL".to_owned(), db.url()),
        ("NOREPEAT_ADMIN_TOKEN".to_owned(), "adm".to_owned()),
    ];
    env.extend(
        shop_env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    let shop = norepeat_testkit::ShopProcess::start(BIN, env).await;
    let base = shop.base_url();
    tokio::task::spawn_blocking(move || {
        storm(
            &["--target", &base],
            &[("NOREPEAT_ADMIN_TOKEN", "adm".to_owned())],
        )
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm_against_running_shops() {
    let (ok, json) = storm_against_a_shop(&[("NOREPEAT_STORE_TIMEOUT_MS", "2000")]).await;
    let rows = json["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 6, "one row a scenario: {json}");
    for r in rows {
        assert_eq!(r["defence"], "target");
        assert_eq!(r["duplicates"], 0, "{r}");
        assert_eq!(r["oversold"], 0, "{r}");
        assert_eq!(r["created"], r["expected"], "{r}");
    }
    assert!(ok);
}

/// A shop that lets duplicates through fails the storm: the exit status is
/// not 0, so a script (or CI) running `norepeat storm` sees the incident.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm_against_a_naive_shop_exits_non_zero() {
    let (ok, json) = storm_against_a_shop(&[("NOREPEAT_DEFENCE", "naive")]).await;
    let rows = json["rows"].as_array().unwrap();
    assert!(
        rows.iter().any(|r| r["duplicates"].as_u64().unwrap() > 0),
        "the naive shop lets duplicates through: {json}"
    );
    assert!(
        !ok,
        "the exit status must say the storm found duplicates: {json}"
    );
}

/// The gateway binary next to `norepeat`, where `cargo build --workspace`
/// (and `cargo nextest run --workspace`) puts it.
fn gateway_bin() -> std::path::PathBuf {
    let bin = std::path::Path::new(BIN).with_file_name("norepeat-gateway");
    assert!(
        bin.is_file(),
        "{} is missing: build it first (cargo build -p norepeat-gateway)",
        bin.display()
    );
    bin
}

/// Processes whose command line holds `needle`.
fn processes_with(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmd) = std::fs::read(entry.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(needle) {
                found.push(cmd);
            }
        }
    }
    found
}

/// The naive shop behind two gateways on one Redis: the gateway rows have
/// no duplicate and oversell nothing where the naive rows show the
/// incident, every legitimate order is made, and no gateway outlives the
/// storm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm_through_the_gateway() {
    gateway_bin();
    let redis = RedisServer::start().await;
    let url = redis.url();
    let (ok, json, storm_pid) = tokio::task::spawn_blocking(move || {
        let child = std::process::Command::new(BIN)
            .args(["storm", "--json", "--requests", "60", "--redis", &url])
            .args(["--defence", "naive,gateway"])
            .env_remove("REDIS_URL")
            .env_remove("DATABASE_URL")
            .env_remove("NOREPEAT_GATEWAY_BIN")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8(out.stdout).unwrap();
        let json: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not one JSON object ({e}): {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.success(), json, pid)
    })
    .await
    .unwrap();
    let rows = json["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 12, "6 scenarios x naive, gateway: {json}");
    let gateway: Vec<&Value> = rows.iter().filter(|r| r["defence"] == "gateway").collect();
    assert_eq!(gateway.len(), 6, "{json}");
    for r in &gateway {
        assert_eq!(r["duplicates"], 0, "{r}");
        assert_eq!(r["oversold"], 0, "{r}");
        assert_eq!(
            r["created"], r["expected"],
            "every legitimate order is made: {r}"
        );
        assert!(
            r["rejected"].as_u64().unwrap() > 0,
            "the gateway stopped the repeats: {r}"
        );
    }
    // Where the naive shop alone makes duplicates, the gateway makes none.
    let incident: Vec<&Value> = rows
        .iter()
        .filter(|r| r["defence"] == "naive" && r["duplicates"].as_u64().unwrap() > 0)
        .collect();
    assert!(
        incident.iter().any(|r| r["scenario"] == "lb-failover"),
        "the naive shop lets the load balancer's resend through: {json}"
    );
    assert!(
        incident.len() >= 3,
        "the naive rows show the incident: {json}"
    );
    assert!(ok, "every gateway row is clean: exit status 0: {json}");
    // The gateways died with the storm, and their files are gone.
    let tag = format!("norepeat-gateway-{storm_pid}-");
    assert_eq!(processes_with(&tag), Vec::<String>::new());
    let left: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&tag))
        .map(|e| e.path())
        .collect();
    assert_eq!(left, Vec::<std::path::PathBuf>::new());
    assert_eq!(redis.keys_without_ttl().await, Vec::<String>::new());
}

/// A missing gateway binary stops the storm with a line naming where it
/// looked: `NOREPEAT_GATEWAY_BIN` and the place next to `norepeat`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm_without_the_gateway_binary_says_where_it_looked() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(BIN)
            .args(["storm", "--json", "--requests", "10", "--redis", &url])
            .args(["--defence", "gateway"])
            .env("NOREPEAT_GATEWAY_BIN", "/nonexistent/norepeat-gateway")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let sibling = std::path::Path::new(BIN).with_file_name("norepeat-gateway");
    assert!(stderr.contains("NOREPEAT_GATEWAY_BIN"), "{stderr}");
    assert!(stderr.contains("/nonexistent/norepeat-gateway"), "{stderr}");
    assert!(stderr.contains(&*sibling.to_string_lossy()), "{stderr}");
}
