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

/// Runs the bench with `args` (no `REDIS_URL` or program paths from the
/// environment unless given); its JSON and its stderr.
fn bench_with(args: &[&str], env: &[(&str, &str)]) -> (Value, String) {
    let mut cmd = std::process::Command::new(BIN);
    cmd.args(["--quick", "--json", "--duration-ms", "250"])
        .args(args)
        .env_remove("REDIS_URL")
        .env_remove("NOREPEAT_IDEMPOTENT_PROXY_BIN")
        .env_remove("NOREPEAT_GATEWAY_BEFORE_BIN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "bench failed: {stdout}\n{stderr}");
    let json = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {stdout}"));
    (json, stderr)
}

/// Row `name` of round `round` (`None`: of the medians).
fn row<'a>(json: &'a Value, round: Option<usize>, name: &str) -> Option<&'a Value> {
    let rows = match round {
        Some(r) => &json["round_results"][r],
        None => &json["results"],
    };
    rows.as_array()?.iter().find(|r| r["name"] == name)
}

/// Whether this machine has what the NGINX Lua row needs (Debian's
/// packages); where it has not, the row must say how to get them.
fn nginx_lua_installed() -> bool {
    std::path::Path::new("/usr/lib/nginx/modules/ngx_http_lua_module.so").is_file()
        && std::path::Path::new("/usr/share/lua/5.1/nginx/redis.lua").is_file()
        && ["/usr/sbin/nginx", "/usr/bin/nginx"]
            .iter()
            .any(|p| std::path::Path::new(p).is_file())
}

/// The fingerprint anchor (NGINX with the guard in Lua) keeps one key a
/// request in the bench's Redis, each with a TTL; the gateway's replay row
/// answers from one record a connection (no new key a request); two
/// rounds give two rounds of results and each row its median; every
/// process's CPU is read beside the figure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lua_anchor_and_the_replay_row_on_redis_over_two_rounds() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    let (json, stderr) = tokio::task::spawn_blocking(move || {
        bench_with(
            &[
                "--redis",
                &url,
                "--rounds",
                "2",
                "--concurrency",
                "8",
                "--only",
                "gateway.nginx_lua",
                "--only",
                "gateway.replay",
            ],
            &[],
        )
    })
    .await
    .unwrap();
    assert_eq!(json["rounds"], 2, "{json}");
    assert_eq!(json["round_results"].as_array().map(Vec::len), Some(2));
    let replay = row(&json, None, "gateway.replay").unwrap_or_else(|| panic!("{json}"));
    assert!(replay["ops_per_s"].as_f64().unwrap() > 0.0, "{replay}");
    assert!(replay["ops_per_s_range"].is_array(), "{replay}");
    for field in [
        "cpu_us_per_op",
        "backend_cpu_us_per_op",
        "store_cpu_us_per_op",
        "loader_cpu_us_per_op",
        "machine_cpu_us_per_op",
    ] {
        assert!(replay[field].as_f64().is_some(), "{field}: {replay}");
    }
    let mut con = redis.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut con)
        .await
        .unwrap();
    // One record a connection a round: a fresh key a request would be
    // thousands.
    let records = keys.iter().filter(|k| !k.starts_with("nginxlua:")).count();
    let replays: u64 = (0..2)
        .map(|r| {
            row(&json, Some(r), "gateway.replay").unwrap()["ops"]
                .as_u64()
                .unwrap()
        })
        .sum();
    assert!(
        records <= 2 * 8 + 4,
        "{records} records for {replays} replays: {keys:?}"
    );
    assert!(
        replays > records as u64,
        "{replays} replays, {records} records"
    );
    if nginx_lua_installed() {
        let sets: u64 = (0..2)
            .map(|r| {
                row(&json, Some(r), "gateway.nginx_lua").unwrap()["ops"]
                    .as_u64()
                    .unwrap()
            })
            .sum();
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut con)
            .await
            .unwrap();
        let calls: u64 = stats
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_set:calls="))
            .and_then(|l| l.split(',').next())
            .unwrap_or_else(|| panic!("no SET in {stats}"))
            .parse()
            .unwrap();
        assert!(calls >= sets, "{calls} SETs for {sets} guarded requests");
        assert!(row(&json, None, "gateway.nginx_lua").unwrap()["cpu_us_per_op"].is_number());
    } else {
        assert!(
            stderr.contains("gateway.nginx_lua left out") && stderr.contains("apt-get install"),
            "{stderr}"
        );
    }
    assert_eq!(redis.keys_without_ttl().await, Vec::<String>::new());
}

/// Without `--redis` the Lua anchor has nowhere to keep its keys: left
/// out, saying so; idempotent-proxy, when not given, is left out with how
/// to get it.
#[test]
fn an_anchor_that_cannot_run_is_left_out_with_how_to_run_it() {
    let (json, stderr) = bench_with(
        &[
            "--only",
            "gateway.nginx_lua",
            "--only",
            "gateway.idempotent_proxy",
        ],
        &[("PATH", "/usr/bin:/bin")],
    );
    assert_eq!(json["results"], serde_json::json!([]), "{json}");
    if nginx_lua_installed() {
        assert!(
            stderr.contains("gateway.nginx_lua left out: its Lua guard keeps its keys in Redis"),
            "{stderr}"
        );
    }
    assert!(
        stderr.contains("gateway.idempotent_proxy left out")
            && stderr.contains("cargo install idempotent-proxy-server --version 1.2.2"),
        "{stderr}"
    );
}

/// With `--idempotent-proxy` (here from `NOREPEAT_IDEMPOTENT_PROXY_BIN`,
/// when the environment names one: it is not built by this workspace),
/// its fresh-key and replay rows are measured on the same Redis, every
/// fresh key a record of its own. Ignored (a skip shows as one, never as
/// a pass): run it with `--ignored` and the variable set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs NOREPEAT_IDEMPOTENT_PROXY_BIN: idempotent-proxy 1.2.2, built outside this workspace"]
async fn idempotent_proxy_rows_when_it_is_given() {
    let bin = std::env::var_os("NOREPEAT_IDEMPOTENT_PROXY_BIN")
        .expect("NOREPEAT_IDEMPOTENT_PROXY_BIN names the idempotent-proxy binary");
    let bin = bin.to_string_lossy().into_owned();
    let redis = RedisServer::start().await;
    let url = redis.url();
    let (json, stderr) = tokio::task::spawn_blocking(move || {
        bench_with(
            &[
                "--redis",
                &url,
                "--idempotent-proxy",
                &bin,
                "--only",
                "gateway.idempotent_proxy",
                "--only",
                "gateway.idempotent_proxy_replay",
            ],
            &[],
        )
    })
    .await
    .unwrap();
    for name in [
        "gateway.idempotent_proxy",
        "gateway.idempotent_proxy_replay",
    ] {
        let r = row(&json, None, name).unwrap_or_else(|| panic!("{name}: {json}\n{stderr}"));
        assert!(r["ops_per_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["cpu_us_per_op"].as_f64().is_some(), "{r}");
    }
    let fresh = row(&json, None, "gateway.idempotent_proxy").unwrap()["ops"]
        .as_u64()
        .unwrap();
    let mut con = redis.connection().await;
    let keys: u64 = redis::cmd("DBSIZE").query_async(&mut con).await.unwrap();
    assert!(keys >= fresh, "{keys} keys for {fresh} fresh keys");
    assert_eq!(redis.keys_without_ttl().await, Vec::<String>::new());
}
