// Over 400 lines on purpose: the README's walk-through, step by step, as one test beside its files' checks.
//! The files under `examples/`, as a user meets them: each passes
//! `norepeat-gateway check` (the binary), and the walk-through of the
//! repository's README ("Put it in front of any service") runs on
//! `examples/gateway.yaml`, step by step, against the binary and
//! `tests/backend.py`, with the answers it shows.

use crate::common::*;
use std::path::{Path, PathBuf};

/// Every file under `examples/` that the gateway reads as its file.
fn example_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// The routes each example has, as `check` counts them.
const ROUTE_COUNTS: &[(&str, usize)] = &[("forms-and-json.yaml", 4), ("gateway.yaml", 5)];

#[test]
fn every_example_file_passes_check() {
    let files = example_files();
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let listed: Vec<&str> = ROUTE_COUNTS.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, listed, "every example is checked here");
    for (path, (_, routes)) in files.iter().zip(ROUTE_COUNTS) {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_norepeat-gateway"))
            .arg("check")
            .arg(path)
            .env_remove("NOREPEAT_GATEWAY_TOKEN_SECRET")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("ok: {routes} routes\n"),
            "{}: {stderr}",
            path.display()
        );
        assert_eq!(out.status.code(), Some(0), "{}", path.display());
        assert_eq!(stderr, "", "{}", path.display());
    }
}

/// `curl -si -X POST URL -H 'X-User-Id: USER' [-H ...] -d BODY`: curl's
/// `-d` sends a form's content type.
async fn curl_post(
    g: &Process,
    path: &str,
    user: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Response {
    let mut req = Client::new().post(url(g, path));
    if let Some(user) = user {
        req = req.header("x-user-id", user);
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(body) = body {
        req = req
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body.to_owned());
    }
    req.send().await.unwrap()
}

/// The status, the `code` and the `detail` of a problem+json answer.
async fn problem(res: Response) -> (u16, String, String) {
    let status = res.status().as_u16();
    let body: Value = res.json().await.unwrap();
    let text = |k: &str| body[k].as_str().unwrap_or_default().to_owned();
    (status, text("code"), text("detail"))
}

fn header(res: &Response, name: &str) -> Option<String> {
    res.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
}

/// Waits until the backend has counted `n` effects on `path`.
async fn counted(b: &Process, path: &str, n: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while effects(b).await[path] != n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path} never reached {n}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The README's walk-through on `examples/gateway.yaml` as shipped, but
/// for the ports: the backend's 9000 and Redis's 6379 are the test's own.
/// The 504 step is the one the stale example failed: without the route's
/// `timeout: 2s` the payment that takes 5 s answered 201.
#[tokio::test]
async fn the_readme_walk_through_answers_as_it_shows() {
    let redis = RedisServer::start().await;
    let b = backend(0).await;
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/gateway.yaml"
    ))
    .unwrap();
    let yaml = example
        .replace(
            "http://127.0.0.1:9000",
            &format!("http://127.0.0.1:{}", b.port),
        )
        .replace("redis://127.0.0.1:6379", &redis.url());
    assert_ne!(
        yaml, example,
        "the example names the ports the walk-through uses"
    );
    let g = gateway(&yaml).await;

    // A form (token route).
    let (s, c, detail) =
        problem(curl_post(&g, "/orders", Some("alice"), &[], Some(r#"{"sku":"A1"}"#)).await).await;
    assert_eq!((s, c.as_str()), (400, "missing_token"));
    assert_eq!(
        detail,
        "Send a repeat token in the Repeat-Token header, the repeatToken query parameter or a repeatToken form field."
    );
    let issued = token_for(&g, "alice").await;
    assert_eq!(issued["expiresIn"], 60);
    let token = issued["repeatToken"].as_str().unwrap().to_owned();
    let with_token = [("repeat-token", token.as_str())];
    let first = curl_post(
        &g,
        "/orders",
        Some("alice"),
        &with_token,
        Some(r#"{"sku":"A1"}"#),
    )
    .await;
    assert_eq!(first.status(), 201);
    assert_eq!(header(&first, "x-order").as_deref(), Some("1"));
    let (s, c, detail) = problem(
        curl_post(
            &g,
            "/orders",
            Some("alice"),
            &with_token,
            Some(r#"{"sku":"A1"}"#),
        )
        .await,
    )
    .await;
    assert_eq!((s, c.as_str()), (409, "duplicate_submission"));
    assert_eq!(
        detail,
        "This form was already submitted. Reload to get a new token."
    );
    let (s, c, detail) = problem(curl_post(&g, "/orders", None, &[], None).await).await;
    assert_eq!((s, c.as_str()), (401, "unauthenticated"));
    assert_eq!(detail, "Exactly one x-user-id header is required.");

    // A double submit (fingerprint route).
    let quick = curl_post(
        &g,
        "/orders/quick",
        Some("alice"),
        &[],
        Some(r#"{"sku":"A1","qty":1,"traceId":"t1"}"#),
    )
    .await;
    assert_eq!(quick.status(), 201);
    let again = curl_post(
        &g,
        "/orders/quick",
        Some("alice"),
        &[],
        Some(r#"{"sku":"A1","qty":1,"traceId":"t2"}"#),
    )
    .await;
    assert_eq!(header(&again, "retry-after").as_deref(), Some("3"));
    let (s, c, detail) = problem(again).await;
    assert_eq!((s, c.as_str()), (409, "duplicate_submission"));
    assert_eq!(
        detail,
        "This request was already submitted; wait before sending it again."
    );

    // A retried payment (Idempotency-Key).
    let key = |k: &'static str| [("idempotency-key", k)];
    let paid = curl_post(
        &g,
        "/payments",
        Some("alice"),
        &key("pay-1001"),
        Some(r#"{"amount":4200}"#),
    )
    .await;
    assert_eq!(paid.status(), 201);
    assert_eq!(header(&paid, "x-order").as_deref(), Some("1"));
    assert_eq!(header(&paid, "x-backend").as_deref(), Some("py"));
    assert_eq!(
        header(&paid, "set-cookie").as_deref(),
        Some("session=s1; HttpOnly")
    );
    let paid_body = paid.text().await.unwrap();
    let replay = curl_post(
        &g,
        "/payments",
        Some("alice"),
        &key("pay-1001"),
        Some(r#"{"amount":4200}"#),
    )
    .await;
    assert_eq!(replay.status(), 201);
    assert_eq!(header(&replay, "x-order").as_deref(), Some("1"));
    assert_eq!(header(&replay, "x-backend").as_deref(), Some("py"));
    assert_eq!(
        header(&replay, "idempotent-replayed").as_deref(),
        Some("true")
    );
    assert_eq!(
        header(&replay, "set-cookie"),
        None,
        "a replay hands out no session"
    );
    assert_eq!(replay.text().await.unwrap(), paid_body, "byte for byte");
    let (s, c, detail) = problem(
        curl_post(
            &g,
            "/payments",
            Some("alice"),
            &key("pay-1001"),
            Some(r#"{"amount":9900}"#),
        )
        .await,
    )
    .await;
    assert_eq!((s, c.as_str()), (422, "idempotency_key_mismatch"));
    assert_eq!(
        detail,
        "This Idempotency-Key was used with a different request; use a new key for a new operation."
    );

    // The service hangs past the route's timeout (2 s): 504, then 409.
    let slow = [("idempotency-key", "pay-1002"), ("x-delay", "5")];
    let (s, c, detail) = problem(
        curl_post(
            &g,
            "/payments",
            Some("alice"),
            &slow,
            Some(r#"{"amount":100}"#),
        )
        .await,
    )
    .await;
    assert_eq!((s, c.as_str()), (504, "upstream_timeout"));
    assert_eq!(
        detail,
        "The upstream did not answer in time, or the connection broke after the request was sent: the outcome is unknown."
    );
    let (s, c, detail) = problem(
        curl_post(
            &g,
            "/payments",
            Some("alice"),
            &key("pay-1002"),
            Some(r#"{"amount":100}"#),
        )
        .await,
    )
    .await;
    assert_eq!((s, c.as_str()), (409, "idempotency_outcome_unknown"));
    assert!(
        detail.starts_with("The request that held this Idempotency-Key ended without a known outcome (it timed out, or its server stopped mid-request); whether it took effect is unknown, so it is not run again."),
        "{detail}"
    );
    assert_eq!(
        effects(&b).await,
        serde_json::json!({"/orders": 1, "/orders/quick": 1, "/payments": 2})
    );

    // A key is the caller's own; a second request while the first runs.
    let bobs = curl_post(
        &g,
        "/payments",
        Some("bob"),
        &key("pay-1001"),
        Some(r#"{"amount":4200}"#),
    )
    .await;
    assert_eq!(bobs.status(), 201);
    assert_eq!(header(&bobs, "x-order").as_deref(), Some("3"));
    let running = [("idempotency-key", "pay-1003"), ("x-delay", "1.5")];
    let g2 = url(&g, "/payments");
    let first = tokio::spawn(async move {
        Client::new()
            .post(g2)
            .header("x-user-id", "alice")
            .header("idempotency-key", "pay-1003")
            .header("x-delay", "1.5")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(r#"{"amount":700}"#)
            .send()
            .await
            .unwrap()
            .status()
    });
    counted(&b, "/payments", 4).await;
    let in_use = curl_post(
        &g,
        "/payments",
        Some("alice"),
        &running,
        Some(r#"{"amount":700}"#),
    )
    .await;
    assert_eq!(header(&in_use, "retry-after").as_deref(), Some("1"));
    let (s, c, detail) = problem(in_use).await;
    assert_eq!((s, c.as_str()), (409, "idempotency_key_in_use"));
    assert_eq!(
        detail,
        "A request with this Idempotency-Key is still being processed; retry shortly with the same key."
    );
    assert_eq!(first.await.unwrap(), 201);
    assert_eq!(effects(&b).await["/payments"], 4, "the second did not run");

    // Shadow mode: three redemptions through, two counted as refusals.
    for _ in 0..3 {
        let res = curl_post(
            &g,
            "/coupons/c7/redeem",
            Some("alice"),
            &[],
            Some(r#"{"coupon":"c7"}"#),
        )
        .await;
        assert_eq!(res.status(), 201);
    }
    let metrics = scrape(&g).await;
    // The exporter's order of series is its own: compared sorted.
    let mut shadow: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("norepeat") && l.contains("shadow_total"))
        .collect();
    shadow.sort_unstable();
    assert_eq!(
        shadow,
        [
            r#"norepeat_gateway_shadow_total{route="POST /coupons/{id}/redeem",would="duplicate"} 2"#,
            r#"norepeat_shadow_total{guard="fingerprint",would="duplicate"} 2"#,
        ]
    );

    // The rate-limited route: past its burst of 5, 429 with its headers.
    // The bucket refills one request each 200 ms, so a slow machine may
    // need a few more than 6 to meet the 429: the first 5 always pass.
    for _ in 0..5 {
        assert_eq!(
            curl_post(&g, "/flash-sale/sku-9", Some("alice"), &[], None)
                .await
                .status(),
            201
        );
    }
    let mut limited = None;
    for _ in 0..50 {
        let res = curl_post(&g, "/flash-sale/sku-9", Some("alice"), &[], None).await;
        if res.status() == 429 {
            limited = Some(res);
            break;
        }
    }
    let limited = limited.expect("a 429 past the burst");
    assert_eq!(header(&limited, "retry-after").as_deref(), Some("1"));
    assert_eq!(
        header(&limited, "ratelimit").as_deref(),
        Some(r#""POST_/flash-sale/_sku_";r=0;t=1"#)
    );
    assert_eq!(
        header(&limited, "ratelimit-policy").as_deref(),
        Some(r#""POST_/flash-sale/_sku_";q=5;w=1"#)
    );
    assert_eq!(problem(limited).await.1, "rate_limited");

    let h = health_once(&g, "store_persistent", false.into()).await;
    assert_eq!(
        h,
        serde_json::json!({"breaker":"Closed","last_reload":null,"records":null,"refusing":[],
            "routes":5,"status":"ok","store":"redis","store_answers":true,"store_lost_data_at":null,
            "store_persistent":false})
    );
}
