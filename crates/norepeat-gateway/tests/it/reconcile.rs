//! `reconcile.lookup`: a retry that meets an unknown outcome asks the
//! backend what became of it (a real backend, `tests/backend.py`, which
//! answers `GET /payments/by-key/KEY` with what its POST with that key did).

use crate::common::*;
use reqwest::{Client, StatusCode};
use serde_json::Value;

const RECONCILED: &str = "
  - match: POST /payments
    guard: idempotency
    timeout: 1s
    reconcile:
      lookup: GET /payments/by-key/{key}
";

async fn pay(g: &Process, key: &str, extra: &[(&str, &str)]) -> reqwest::Response {
    let mut req = Client::new()
        .post(url(g, "/payments"))
        .header("x-user-id", "u1")
        .header("idempotency-key", key)
        .body("{}");
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

/// Three unknown outcomes, three answers of the lookup: the effect
/// happened (the retry gets the backend's account of it, replayed and
/// marked reconciled, to every later retry, asked once), it did not (the
/// retry runs as attempt 2), the backend cannot tell (409, the record
/// kept). Counted per result. Before: every retry got 409 until the record's
/// retention ended.
#[tokio::test]
async fn a_retry_that_meets_an_unknown_outcome_asks_the_backend() {
    let b = backend(0).await;
    let g = gateway(&file(&b, "memory", RECONCILED)).await;

    // The backend paid, then answered too late: 504, outcome unknown.
    let first = pay(&g, "k/done", &[("x-delay", "2")]).await;
    assert_eq!(first.status(), StatusCode::GATEWAY_TIMEOUT);
    for _ in 0..2 {
        let retry = pay(&g, "k/done", &[]).await;
        assert_eq!(retry.status(), StatusCode::OK);
        assert_eq!(retry.headers()["idempotent-replayed"], "true");
        assert_eq!(retry.headers()["idempotency-reconciled"], "true");
        assert!(retry.headers().get("set-cookie").is_none());
        let found: Value = retry.json().await.unwrap();
        assert_eq!(found["found"], true, "{found}");
    }
    let seen = effects(&b).await;
    assert_eq!(
        (seen["/payments"].as_u64(), seen["lookups"].as_u64()),
        (Some(1), Some(1))
    );

    // It stalled before doing anything: the lookup finds nothing, and the
    // retry runs, told it is the second attempt.
    let first = pay(&g, "k-absent", &[("x-no-effect", "1"), ("x-delay", "2")]).await;
    assert_eq!(first.status(), StatusCode::GATEWAY_TIMEOUT);
    let retry = pay(&g, "k-absent", &[]).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert!(retry.headers().get("idempotent-replayed").is_none());
    assert_eq!(
        attempts(&b, "/payments").await.last(),
        Some(&Value::from("2"))
    );
    let again = pay(&g, "k-absent", &[]).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(effects(&b).await["/payments"], 2);

    // The backend's own 500 (under `keep`: unknown), and a lookup that
    // cannot tell (503): still unknown, never run again.
    let first = pay(&g, "k-unknown", &[("x-status", "500")]).await;
    assert_eq!(first.status(), StatusCode::INTERNAL_SERVER_ERROR);
    for _ in 0..2 {
        let (status, code) = code(pay(&g, "k-unknown", &[("x-lookup", "503")]).await).await;
        assert_eq!(
            (status, code.as_str()),
            (StatusCode::CONFLICT, "idempotency_outcome_unknown")
        );
    }
    assert_eq!(effects(&b).await["/payments"], 3);

    let m = scrape(&g).await;
    for (result, n) in [("done", 1), ("absent", 1), ("unknown", 2)] {
        let labels = format!("route=\"POST /payments\",result=\"{result}\"");
        assert_eq!(
            value(&m, "norepeat_gateway_reconcile_total", &labels),
            n,
            "{result}"
        );
    }
}
