//! `on_repeat: replay` on token and fingerprint routes: a repeat gets the
//! first answer, byte for byte, instead of 409; the backend runs once.

use crate::common::*;
use reqwest::{Client, StatusCode};
use std::time::Duration;

const REPLAYING: &str = "
  - match: POST /orders
    guard: token
    on_repeat: replay
  - match: POST /orders/quick
    guard: fingerprint
    window: 3s
    on_repeat: replay
  - match: POST /orders/impatient
    guard: fingerprint
    on_repeat: replay
    wait: 300ms
";

fn client() -> Client {
    // A browser's second click does not follow the first one's redirect
    // here: the test reads the 303 itself.
    Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// A form's two clicks with one token: the first runs (a 303 to the order
/// page), the second, sent while the first is still at the backend, waits
/// and gets the same 303 (the same order), replayed; a third, later, too.
/// Before: the second click got 409 `duplicate_submission` and no page.
#[tokio::test]
async fn a_second_click_with_the_token_gets_the_first_answer() {
    let b = backend(0).await;
    let g = gateway(&file(&b, "memory", REPLAYING)).await;
    let token = token_for(&g, "u1").await["repeatToken"]
        .as_str()
        .unwrap()
        .to_owned();
    let click = |delay: &'static str| {
        client()
            .post(url(&g, "/orders"))
            .header("x-user-id", "u1")
            .header("x-status", "303")
            .header("x-delay", delay)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("sku=A1&repeatToken={token}"))
            .send()
    };
    let first = tokio::spawn(click("1"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = click("0").await.unwrap();
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), StatusCode::SEE_OTHER);
    assert_eq!(second.status(), StatusCode::SEE_OTHER);
    assert_eq!(second.headers()["idempotent-replayed"], "true");
    assert_eq!(second.headers()["x-order"], first.headers()["x-order"]);
    let third = click("0").await.unwrap();
    assert_eq!(third.headers()["x-order"], first.headers()["x-order"]);
    assert_eq!(effects(&b).await["/orders"], 1);
    let m = scrape(&g).await;
    assert_eq!(
        value(
            &m,
            "norepeat_gateway_requests_total",
            "route=\"POST /orders\",outcome=\"replayed\""
        ),
        2
    );
}

/// The same body twice within the window on a fingerprint route: the
/// repeat gets the first answer (its body byte for byte); past `wait`
/// with the first still at the backend, 409 `duplicate_submission` as
/// under `refuse`.
#[tokio::test]
async fn a_repeat_of_the_same_body_gets_the_first_answer_or_409_past_wait() {
    let b = backend(0).await;
    let g = gateway(&file(&b, "memory", REPLAYING)).await;
    let post = |path: &'static str, delay: &'static str| {
        client()
            .post(url(&g, path))
            .header("x-user-id", "u1")
            .header("x-delay", delay)
            .header("content-type", "application/json")
            .body(r#"{"sku":"A1","qty":1}"#)
            .send()
    };
    let first = tokio::spawn(post("/orders/quick", "1"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = post("/orders/quick", "0").await.unwrap();
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(second.headers()["idempotent-replayed"], "true");
    assert_eq!(first.bytes().await.unwrap(), second.bytes().await.unwrap());
    assert_eq!(effects(&b).await["/orders/quick"], 1);

    let slow = tokio::spawn(post("/orders/impatient", "2"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, code) = code(post("/orders/impatient", "0").await.unwrap()).await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::CONFLICT, "duplicate_submission")
    );
    assert_eq!(slow.await.unwrap().unwrap().status(), StatusCode::CREATED);
    assert_eq!(effects(&b).await["/orders/impatient"], 1);
}
