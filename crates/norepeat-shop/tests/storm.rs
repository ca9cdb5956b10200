//! `norepeat storm`: the naive service shows the incident, every defended
//! row shows none of it; on embedded defaults and on Redis + PostgreSQL.

#![allow(clippy::unwrap_used)]

use norepeat_testkit::{PgDatabase, RedisServer};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_norepeat");

fn storm(extra: &[&str], env: &[(&str, String)]) -> (bool, Value) {
    let mut cmd = std::process::Command::new(BIN);
    cmd.args(["storm", "--json", "--requests", "60"])
        .args(extra);
    cmd.env_remove("REDIS_URL").env_remove("DATABASE_URL");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let json: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {stdout}"));
    (out.status.success(), json)
}

fn check(json: &Value) {
    let rows = json["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 24, "6 scenarios x 4 defences");
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
    assert_eq!(token_outage.len(), 4);
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
    let (ok, json) = storm(&[], &[]);
    check(&json);
    assert!(ok, "exit status must be 0 when every defended row is clean");
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
    check(&json);
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
