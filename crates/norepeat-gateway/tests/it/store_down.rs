//! The gateway with its Redis gone (issue 36): a fail-open route still
//! catches the repeats that reach this instance, against the bounded local
//! memory the README promises, and a fail-closed route still refuses.
//! Against the order service of `tests/backend.py`, which counts one
//! effect per request it runs.

// The helpers below are test code too: a failure is a panic with its place.

use norepeat_testkit::{RedisServer, ShopProcess, free_port};
use reqwest::{Client, StatusCode};
use serde_json::Value;

/// A server process of the test kit and the port it listens on.
struct Process {
    _process: ShopProcess,
    port: u16,
}

async fn start(bin: &str, args: Vec<String>) -> Process {
    let process = ShopProcess::spawn(bin, args, Vec::new()).await;
    let port = process
        .base_url()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a port in the announced address");
    Process {
        _process: process,
        port,
    }
}

fn url(p: &Process, path: &str) -> String {
    format!("http://127.0.0.1:{}{path}", p.port)
}

async fn effects(backend: &Process) -> Value {
    reqwest::get(url(backend, "/effects"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The status and the problem's `code` (empty when there is none).
async fn answer(res: reqwest::Response) -> (StatusCode, String) {
    let status = res.status();
    let body: Value = res.json().await.unwrap_or(Value::Null);
    (status, body["code"].as_str().unwrap_or_default().to_owned())
}

const ROUTES: &str = "
  - match: POST /orders
    guard: token
  - match: POST /orders/quick
    guard: fingerprint
    window: 1m
  - match: POST /orders/strict
    guard: fingerprint
    window: 1m
    on_store_failure: closed
";

#[tokio::test]
async fn with_redis_down_a_fail_open_route_still_catches_its_own_repeats() {
    let mut redis = RedisServer::start().await;
    let backend = start(
        "python3",
        vec![
            concat!(env!("CARGO_MANIFEST_DIR"), "/tests/backend.py").to_owned(),
            "0".to_owned(),
        ],
    )
    .await;
    let dir = std::env::temp_dir().join(format!("norepeat-gw-down-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{}.yaml", free_port()));
    std::fs::write(
        &file,
        format!(
            "upstream: http://127.0.0.1:{}\nstore: {}\nidentity:\n  header: X-User-Id\nroutes:\n{ROUTES}",
            backend.port,
            redis.url()
        ),
    )
    .unwrap();
    let g = start(
        env!("CARGO_BIN_EXE_norepeat-gateway"),
        [
            "--config",
            &file.to_string_lossy(),
            "--listen",
            "127.0.0.1:0",
        ]
        .map(String::from)
        .into(),
    )
    .await;
    let c = Client::new();
    let token: Value = c
        .get(url(&g, "/.norepeat/token"))
        .header("x-user-id", "u1")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = token["repeatToken"].as_str().unwrap().to_owned();

    redis.kill();
    let post = |path: &str| {
        c.post(url(&g, path))
            .header("x-user-id", "u1")
            .header("content-type", "application/json")
            .body(r#"{"sku":"a1","qty":1}"#)
            .send()
    };
    assert_eq!(answer(post("/orders/quick").await.unwrap()).await.0, 201);
    assert_eq!(
        answer(post("/orders/quick").await.unwrap()).await,
        (StatusCode::CONFLICT, "duplicate_submission".to_owned()),
        "the repeat of a quick order, Redis down"
    );
    assert_eq!(effects(&backend).await["/orders/quick"], 1);

    // A token is still good once on this instance.
    let order = || {
        c.post(url(&g, "/orders"))
            .header("x-user-id", "u1")
            .header("repeat-token", &token)
            .header("content-type", "application/json")
            .body(r#"{"sku":"a2","qty":1}"#)
            .send()
    };
    assert_eq!(answer(order().await.unwrap()).await.0, 201);
    assert_eq!(
        answer(order().await.unwrap()).await,
        (StatusCode::CONFLICT, "duplicate_submission".to_owned()),
        "a token used again, Redis down"
    );
    assert_eq!(effects(&backend).await["/orders"], 1);

    // A fail-closed route has no memory to fall back on: it refuses.
    assert_eq!(
        answer(post("/orders/strict").await.unwrap()).await,
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "guard_unavailable".to_owned()
        )
    );
    assert_eq!(effects(&backend).await["/orders/strict"], Value::Null);
    let _ = std::fs::remove_file(&file);
}
