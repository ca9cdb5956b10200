// Over 400 lines on purpose: one Flask app's scenarios (the rotating cookie, the favicon, whoami refusing or down, concurrency, shadow, the admin) sharing its session helpers.
//! `identity.introspect` (issue 51, item 4): the backend says who the
//! caller is. Against the real gateway binary, a real Redis of the test
//! kit and a real Flask app (`tests/flask_app.py`) whose session cookie
//! changes on every answer, as Flask's does whenever the session changes.
//!
//! Flask runs from the workspace's `.venv/` (`./scripts/test.sh` installs
//! it there), or from the Python `NOREPEAT_FLASK_PYTHON` names. Without
//! one the tests fail, saying so: a check that did not run is never
//! reported as passed.

use crate::common::{Process, RedisServer, gateway, url};
use reqwest::{Client, Response, StatusCode};
use serde_json::Value;
use std::time::Duration;

/// A Python that imports Flask, or why there is none.
fn flask_python() -> String {
    let candidates: Vec<String> = match std::env::var("NOREPEAT_FLASK_PYTHON") {
        Ok(p) => vec![p],
        Err(_) => vec![concat!(env!("CARGO_MANIFEST_DIR"), "/../../.venv/bin/python").to_owned()],
    };
    for c in &candidates {
        let ok = std::process::Command::new(c)
            .args(["-c", "import flask"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return c.clone();
        }
    }
    panic!(
        "no Python with Flask (tried {candidates:?}). ./scripts/test.sh installs it into .venv/; \
         by hand: python3 -m venv .venv && .venv/bin/pip install flask \
         (or set NOREPEAT_FLASK_PYTHON)"
    )
}

/// The Flask app, listening on a free port.
async fn flask() -> Process {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/flask_app.py");
    Process::start(&flask_python(), vec![script.to_owned(), "0".to_owned()]).await
}

/// A gateway in front of `app`, keys in `redis`, with `identity` and the
/// app's two guarded routes.
async fn gateway_for(app: &Process, redis: &RedisServer, identity: &str) -> Process {
    gateway(&format!(
        "upstream: http://127.0.0.1:{}
store: {}
identity:
{identity}
routes:
  - match: POST /payments
    guard: idempotency
    retention: 1m
  - match: POST /orders
    guard: token
",
        app.port,
        redis.url()
    ))
    .await
}

const INTROSPECT: &str = "  introspect:
    path: /whoami
    user: { json: /user/id }
    timeout: 1s
  required: true";

/// [`INTROSPECT`] with the time a held call needs.
const PATIENT: &str = "  introspect:
    path: /whoami
    user: { json: /user/id }
    timeout: 30s
  required: true";

const COOKIE: &str = "  cookie: session
  required: true";

/// A browser's cookie jar of one cookie: the app's `session`, replaced by
/// each answer that sets it.
struct Session(String);

impl Session {
    /// Logged in as `user` (straight at the app).
    async fn login(app: &Process, user: &str) -> Self {
        let res = Client::new()
            .post(url(app, &format!("/login?user={user}")))
            .send()
            .await
            .unwrap();
        let mut s = Session(String::new());
        assert!(s.take(&res), "the login sets the session");
        s
    }

    /// Keeps the `session` an answer sets; whether it set one.
    fn take(&mut self, res: &Response) -> bool {
        let set = res
            .headers()
            .get_all("set-cookie")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(|v| v.split(';').next()?.strip_prefix("session="));
        match set {
            Some(v) => {
                self.0 = v.to_owned();
                true
            }
            None => false,
        }
    }

    fn cookie(&self) -> String {
        format!("session={}", self.0)
    }
}

/// What the app counted: its whoami calls, charges and orders.
async fn counts(app: &Process) -> Value {
    reqwest::get(url(app, "/counts"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn control(app: &Process, query: &str) {
    Client::new()
        .post(url(app, &format!("/control?{query}")))
        .send()
        .await
        .unwrap();
}

/// `POST /payments` through `g` with `key` and the session's cookie.
async fn pay(g: &Process, session: &Session, key: &str) -> Response {
    Client::new()
        .post(url(g, "/payments"))
        .header("cookie", session.cookie())
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(r#"{"amount":5}"#)
        .send()
        .await
        .unwrap()
}

/// [`pay`] until its answer is not a 503: a store slow to answer a cold
/// gateway's first calls (on a loaded machine) is refused fail-closed, and
/// nothing ran; the client's retry is the same request.
async fn pay_answered(g: &Process, session: &Session, key: &str) -> Response {
    for _ in 0..100 {
        let res = pay(g, session, key).await;
        if res.status() != StatusCode::SERVICE_UNAVAILABLE {
            return res;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{key}: 503 for 10 s");
}

async fn problem(res: Response) -> (StatusCode, String) {
    let status = res.status();
    let body: Value = res.json().await.unwrap_or(Value::Null);
    (status, body["code"].as_str().unwrap_or_default().to_owned())
}

/// A payment, its answer's new cookie taken as a browser takes it, then
/// the retry with that cookie (the client never saw the first answer's
/// body, say): how many charges the app made.
async fn a_payment_and_its_retry(identity: &str) -> u64 {
    let (app, redis) = (flask().await, RedisServer::start().await);
    let g = gateway_for(&app, &redis, identity).await;
    let mut session = Session::login(&app, "alice").await;
    let first = pay_answered(&g, &session, "pay-1").await;
    assert_eq!(first.status(), StatusCode::CREATED, "{:?}", first.headers());
    let before = session.0.clone();
    assert!(session.take(&first), "the app rotates its cookie");
    assert_ne!(session.0, before);
    let retry = pay_answered(&g, &session, "pay-1").await;
    assert!(retry.status().is_success() || retry.status() == StatusCode::CONFLICT);
    counts(&app).await["charges"].as_u64().unwrap()
}

/// The retry with the refreshed cookie is the same caller: its record is
/// found and replayed, one charge. (Before `introspect` the gateway did
/// not start on this file.)
#[tokio::test]
async fn a_retry_with_the_refreshed_cookie_replays() {
    assert_eq!(a_payment_and_its_retry(INTROSPECT).await, 1);
}

/// The finding this identity answers, kept as its witness: with the
/// rotating cookie as the identity, the same retry is a new caller, and
/// the payment is charged twice.
#[tokio::test]
async fn a_rotating_cookie_as_the_identity_charges_the_retry_again() {
    assert_eq!(a_payment_and_its_retry(COOKIE).await, 2);
}

/// The page fetches its token; the browser's next request (the favicon)
/// refreshes the cookie; the form posts with the new cookie. One order,
/// with introspection; with the cookie as the identity, the token was
/// another caller's: 409 and no order.
async fn the_favicon_case(identity: &str) -> (StatusCode, u64) {
    let (app, redis) = (flask().await, RedisServer::start().await);
    let g = gateway_for(&app, &redis, identity).await;
    let http = Client::new();
    let mut session = Session::login(&app, "bob").await;
    let page = http
        .get(url(&g, "/form"))
        .header("cookie", session.cookie())
        .send()
        .await
        .unwrap();
    assert!(session.take(&page));
    let token = http
        .get(url(&g, "/.norepeat/token"))
        .header("cookie", session.cookie())
        .send()
        .await
        .unwrap();
    assert_eq!(token.status(), StatusCode::OK);
    assert!(
        token.headers().get("set-cookie").is_none(),
        "whoami's Set-Cookie goes nowhere"
    );
    let token: Value = token.json().await.unwrap();
    let token = token["repeatToken"].as_str().unwrap().to_owned();
    let icon = http
        .get(url(&g, "/favicon.ico"))
        .header("cookie", session.cookie())
        .send()
        .await
        .unwrap();
    assert!(session.take(&icon), "the favicon refreshes the cookie");
    let order = http
        .post(url(&g, "/orders"))
        .header("cookie", session.cookie())
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("repeatToken={token}&sku=A1"))
        .send()
        .await
        .unwrap();
    let status = order.status();
    (status, counts(&app).await["orders"].as_u64().unwrap())
}

#[tokio::test]
async fn the_favicon_case_makes_one_order() {
    assert_eq!(the_favicon_case(INTROSPECT).await, (StatusCode::CREATED, 1));
}

/// The finding from Chromium, kept as its witness: one click, 409, no
/// order.
#[tokio::test]
async fn the_favicon_case_with_a_rotating_cookie_identity_is_refused() {
    assert_eq!(the_favicon_case(COOKIE).await, (StatusCode::CONFLICT, 0));
}

/// 401 or 403 from whoami: 401 `unauthenticated`; no answer in time or a
/// 5xx: 503 `guard_unavailable` with `Retry-After`; no credential at all:
/// the missing identity of `required: true`, with no call. The backend's
/// payment runs in none of them.
#[tokio::test]
async fn whoami_refusing_failing_or_slow_is_401_or_503() {
    let (app, redis) = (flask().await, RedisServer::start().await);
    let g = gateway_for(
        &app,
        &redis,
        "  introspect: { path: /whoami, user: { header: X-User-Id }, timeout: 300ms, cache: 1s }
  required: true",
    )
    .await;
    let http = Client::new();
    // A session without a user (the app's own cookie for anyone).
    let anonymous = http.get(url(&app, "/form")).send().await.unwrap();
    let mut nobody = Session(String::new());
    assert!(nobody.take(&anonymous));
    assert_eq!(
        problem(pay(&g, &nobody, "k-anon").await).await,
        (StatusCode::UNAUTHORIZED, "unauthenticated".to_owned())
    );
    let bearer = http
        .post(url(&g, "/payments"))
        .header("authorization", "Bearer not-a-session")
        .header("idempotency-key", "k-bearer")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(
        problem(bearer).await,
        (StatusCode::UNAUTHORIZED, "unauthenticated".to_owned())
    );
    let calls = counts(&app).await["whoami"].as_u64().unwrap();
    let bare = http
        .post(url(&g, "/payments"))
        .header("idempotency-key", "k-bare")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(
        problem(bare).await,
        (StatusCode::UNAUTHORIZED, "unauthenticated".to_owned())
    );
    assert_eq!(
        counts(&app).await["whoami"].as_u64().unwrap(),
        calls,
        "nothing to ask with, nobody asked"
    );
    let carol = Session::login(&app, "carol").await;
    for (mode, key) in [("down", "k-down"), ("slow", "k-slow")] {
        control(&app, &format!("whoami={mode}")).await;
        let res = pay(&g, &carol, key).await;
        assert!(res.headers().contains_key("retry-after"), "{mode}");
        assert_eq!(
            problem(res).await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "guard_unavailable".to_owned()
            ),
            "{mode}"
        );
    }
    assert_eq!(counts(&app).await["charges"], 0);
    let m = crate::common::scrape(&g).await;
    let calls = |result: &str| {
        crate::common::value(
            &m,
            "norepeat_gateway_introspect_total",
            &format!("result=\"{result}\""),
        )
    };
    assert_eq!((calls("refused"), calls("unavailable")), (2, 2), "{m}");
    // Back up: the same credential is asked again (a failure is not kept).
    control(&app, "whoami=ok").await;
    assert_eq!(
        pay_answered(&g, &carol, "k-up").await.status(),
        StatusCode::CREATED
    );
    // What whoami was sent: the caller's headers and the forwarding ones,
    // never the request's own (its key, its body's type).
    let seen = counts(&app).await["whoami_headers"].clone();
    for headers in seen.as_array().unwrap() {
        let names: Vec<&str> = headers
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        for name in &names {
            assert!(
                [
                    "cookie",
                    "authorization",
                    "host",
                    "x-forwarded-for",
                    "x-forwarded-host",
                    "x-forwarded-proto",
                    "forwarded",
                ]
                .contains(name),
                "whoami was sent {name}"
            );
        }
    }
}

/// Concurrent requests with one credential share one whoami call: the
/// app holds the first call until every request has had the time to
/// reach the gateway, then answers it once.
#[tokio::test]
async fn concurrent_requests_with_one_credential_make_one_call() {
    let (app, redis) = (flask().await, RedisServer::start().await);
    let g = gateway_for(&app, &redis, PATIENT).await;
    let session = Session::login(&app, "dave").await;
    control(&app, "whoami=gate").await;
    let g = std::sync::Arc::new(g);
    let session = std::sync::Arc::new(session);
    let payments: Vec<_> = (0..8)
        .map(|i| {
            let (g, session) = (std::sync::Arc::clone(&g), std::sync::Arc::clone(&session));
            tokio::spawn(
                async move { pay_answered(&g, &session, &format!("k-{i}")).await.status() },
            )
        })
        .collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while counts(&app).await["whoami"].as_u64() < Some(1) {
        assert!(tokio::time::Instant::now() < deadline, "whoami never asked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The others reach the gateway meanwhile (a slow machine that lets
    // some come after the answer finds the answer kept: still one call).
    tokio::time::sleep(Duration::from_millis(300)).await;
    control(&app, "open=1").await;
    for p in payments {
        assert_eq!(p.await.unwrap(), StatusCode::CREATED);
    }
    let c = counts(&app).await;
    assert_eq!(
        (c["whoami"].as_u64(), c["charges"].as_u64()),
        (Some(1), Some(8))
    );
}

/// Only a route that reads the caller asks: a rate limit by address never
/// does. A `shadow` route never refuses: with whoami down its payment
/// goes through (its layer counts the request without a caller).
#[tokio::test]
async fn only_a_route_that_reads_the_caller_asks_and_shadow_never_refuses() {
    let (app, redis) = (flask().await, RedisServer::start().await);
    let g = gateway(&format!(
        "upstream: http://127.0.0.1:{}
store: {}
identity:
{INTROSPECT}
routes:
  - match: POST /payments
    guard: idempotency
    shadow: true
  - match: POST /orders
    rate_limit: {{ rate: 100/s, by: address }}
",
        app.port,
        redis.url()
    ))
    .await;
    let session = Session::login(&app, "frank").await;
    control(&app, "whoami=down").await;
    assert_eq!(
        pay(&g, &session, "k-shadow").await.status(),
        StatusCode::CREATED
    );
    let asked = counts(&app).await["whoami"].as_u64().unwrap();
    assert_eq!(asked, 1, "the shadow route asked");
    let order = Client::new()
        .post(url(&g, "/orders"))
        .header("cookie", session.cookie())
        .body("sku=A1")
        .send()
        .await
        .unwrap();
    assert_eq!(order.status(), StatusCode::CREATED);
    let c = counts(&app).await;
    assert_eq!(
        (c["whoami"].as_u64(), c["charges"].as_u64()),
        (Some(1), Some(1))
    );
}

/// The admin reads a record of a caller the backend names by the headers
/// the client sent: its cookie, however often refreshed since.
#[tokio::test]
async fn the_admin_reads_the_record_of_an_introspected_caller() {
    let (app, redis) = (flask().await, RedisServer::start().await);
    let admin = crate::common::free_port();
    let token = "an-admin-token-of-some-length";
    let g = crate::common::gateway_env(
        &format!(
            "admin: {{ listen: 127.0.0.1:{admin}, token_env: NOREPEAT_GATEWAY_ADMIN_TOKEN }}
upstream: http://127.0.0.1:{}
store: {}
identity:
{INTROSPECT}
routes:
  - match: POST /payments
    guard: idempotency
",
            app.port,
            redis.url()
        ),
        &[("NOREPEAT_GATEWAY_ADMIN_TOKEN", token)],
    )
    .await;
    let mut session = Session::login(&app, "erin").await;
    let paid = pay_answered(&g, &session, "k-adm").await;
    assert_eq!(paid.status(), StatusCode::CREATED);
    assert!(session.take(&paid));
    let read = |cookie: String| {
        Client::new()
            .get(format!(
                "http://127.0.0.1:{admin}/.norepeat/admin/record?method=POST&path=/payments&key=k-adm&host=127.0.0.1"
            ))
            .header("norepeat-admin-token", token)
            .header("cookie", cookie)
            .send()
    };
    let res = read(session.cookie()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let record: Value = res.json().await.unwrap();
    assert_eq!(record["state"], "completed", "{record}");
    // Another user's cookie reads no record of erin's.
    let other = Session::login(&app, "grace").await;
    let res = read(other.cookie()).await.unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
}
