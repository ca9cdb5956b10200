//! Every example in `examples/` runs to its end (it asserts what it shows
//! along the way), against the test kit's services: a private Redis, a fresh
//! PostgreSQL database. An example that stops asserting, or that panics,
//! fails here.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The example's binary, built by the same `cargo test`/`nextest` run (a
/// plain run builds every example); built here when a filtered run did not.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // <target>/<profile>/deps/it-<hash>
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let path = profile_dir.join("examples").join(name);
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args([
                "build",
                "-p",
                "norepeat",
                "--all-features",
                "--example",
                name,
            ])
            .status()
            .unwrap();
        assert!(status.success(), "building example {name}");
    }
    path
}

/// Runs an example with `env`, and gives its standard output; fails the test
/// when it exits non-zero or takes over a minute.
async fn run(name: &str, env: &[(&str, String)]) -> String {
    let mut cmd = tokio::process::Command::new(example(name));
    cmd.env_clear()
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("example {name} ran over a minute"))
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "example {name} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn axum_fingerprint_catches_the_double_click_on_redis() {
    let redis = norepeat_testkit::RedisServer::start().await;
    let out = run("axum_fingerprint", &[("REDIS_URL", redis.url())]).await;
    assert!(out.contains("first submit: 200 OK"), "{out}");
    assert!(
        out.contains("double click: 409 Conflict application/problem+json"),
        "{out}"
    );
    // It left keys, each with a TTL.
    assert!(redis.dbsize().await > 0);
    assert_eq!(redis.keys_without_ttl().await, Vec::<String>::new());
}

#[tokio::test]
async fn idempotency_replay_pays_once() {
    let out = run("idempotency_replay", &[]).await;
    assert!(
        out.contains("retry while the first runs: 409 Conflict"),
        "{out}"
    );
    assert!(out.contains("(replayed)"), "{out}");
    assert!(
        out.contains("same key, other amount: 422 Unprocessable Entity"),
        "{out}"
    );
    assert!(out.contains("payments made: 1"), "{out}");
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn consumer_once_writes_once_for_three_deliveries() {
    let out = run("consumer_once", &[]).await;
    assert_eq!(out.matches("awarded 30").count(), 3, "{out}");
    assert!(out.contains("rows written: 1"), "{out}");
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn sql_store_commits_the_record_with_the_payment() {
    let db = norepeat_testkit::PgDatabase::fresh().await;
    let out = run("sql_store", &[("DATABASE_URL", db.url())]).await;
    assert!(out.contains("first: 201 Created"), "{out}");
    assert!(out.contains("retry: replayed"), "{out}");
    // One payment row for the run's order, whatever the retry did.
    let paid = out
        .lines()
        .find(|l| l.starts_with("payments for order-"))
        .unwrap_or_default();
    assert!(paid.ends_with(": 1"), "{out}");
    // The completed record is a row of that database.
    let records: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM norepeat_keys")
        .fetch_one(&db.pool().await)
        .await
        .unwrap();
    assert_eq!(records, 1);
}

#[tokio::test]
async fn webhook_verify_refuses_what_is_not_signed_right() {
    let out = run("webhook_verify", &[]).await;
    assert!(out.contains("signed notice: 200 OK"), "{out}");
    for refused in [
        "forged notice",
        "signature of another body",
        "unsigned notice",
    ] {
        assert!(
            out.contains(&format!("{refused}: 401 Unauthorized")),
            "{out}"
        );
    }
}

#[tokio::test]
async fn rate_limit_headers_refuse_the_fourth_request() {
    let out = run("rate_limit_headers", &[]).await;
    assert!(out.contains("u1 request 3: 200 OK"), "{out}");
    assert!(out.contains("u1 request 4: 429 Too Many Requests"), "{out}");
    assert!(out.contains("u2 request 1: 200 OK"), "{out}");
}
