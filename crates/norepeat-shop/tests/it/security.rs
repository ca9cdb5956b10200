// Over 400 lines: issue 14's checks, one scenario per rule against one shop process set-up; the shared helpers are in common/.
//! Issue 14: who may do what, and what input may reach the database.
//! Against the shop binary, as a user runs it, on SQLite and on a fresh
//! PostgreSQL database.

// Test helpers outside #[test] functions unwrap too: a failure there is a failed test.
use crate::common;

use common::{Answer, BIN};
use norepeat_testkit::{ShopProcess, TestDb, sign_callback, sign_callback_now};
use reqwest::StatusCode;
use serde_json::{Value, json};

const SECRET: &str = "whsec_test";

struct Shop {
    base: String,
    http: reqwest::Client,
    _process: ShopProcess,
    _db: TestDb,
}

#[derive(Clone, Copy, Debug)]
enum Backend {
    Sqlite,
    Postgres,
}

/// The shop binary on `backend`, with the extra environment `env`.
async fn shop(backend: Backend, env: &[(&str, &str)]) -> Shop {
    let db = match backend {
        Backend::Sqlite => TestDb::sqlite(),
        Backend::Postgres => TestDb::postgres().await,
    };
    let mut vars = vec![("DATABASE_URL".to_owned(), db.url())];
    vars.extend(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    let process = ShopProcess::start(BIN, vars).await;
    Shop {
        base: process.base_url(),
        http: reqwest::Client::new(),
        _process: process,
        _db: db,
    }
}

impl Shop {
    async fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<reqwest::Body>,
    ) -> Answer {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut b = self.http.request(method, format!("{}{path}", self.base));
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let res = b.body(body).send().await.unwrap();
        Answer::read(path, res).await
    }

    async fn get(&self, path: &str, user: &str) -> Answer {
        self.request("GET", path, &[("x-user-id", user)], "").await
    }

    async fn post_json(&self, path: &str, headers: &[(&str, &str)], body: &str) -> Answer {
        let mut h = vec![("content-type", "application/json")];
        h.extend_from_slice(headers);
        self.request("POST", path, &h, body.to_owned()).await
    }

    async fn order(&self, user: &str) -> String {
        let a = self
            .post_json(
                "/orders/quick",
                &[("x-user-id", user)],
                r#"{"sku":"SKU-1","quantity":1}"#,
            )
            .await;
        assert_eq!(a.status, StatusCode::CREATED, "{:?}", a.body);
        a.body["orderId"].as_str().unwrap().to_owned()
    }

    async fn payment(&self, user: &str, order_id: &str) -> String {
        let key = format!("pay-{order_id}");
        let a = self
            .post_json(
                "/payments",
                &[("x-user-id", user), ("idempotency-key", &key)],
                &json!({"orderId": order_id, "amount": 1999}).to_string(),
            )
            .await;
        assert_eq!(a.status, StatusCode::CREATED, "{:?}", a.body);
        a.body["paymentId"].as_str().unwrap().to_owned()
    }
}

const SIGNED: &[(&str, &str)] = &[("NOREPEAT_CALLBACK_SECRET", SECRET)];

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

// ---- Admin ---------------------------------------------------------------

#[tokio::test]
async fn an_empty_admin_token_turns_admin_off() {
    let s = shop(Backend::Sqlite, &[("NOREPEAT_ADMIN_TOKEN", "")]).await;
    for headers in [&[][..], &[("x-admin-token", "")][..]] {
        let mut h = vec![("content-type", "application/json")];
        h.extend_from_slice(headers);
        let a = s
            .request("PUT", "/admin/stock/SKU-1", &h, r#"{"available":5}"#)
            .await;
        assert_eq!(a.code(), (404, "not_found"), "{headers:?}");
        let a = s.request("POST", "/admin/reconcile", headers, "").await;
        assert_eq!(a.code(), (404, "not_found"), "{headers:?}");
    }
    assert_eq!(s.get("/stock/SKU-1", "u1").await.body["available"], 100);
}

#[tokio::test]
async fn an_admin_token_must_match_whole() {
    let s = shop(Backend::Sqlite, &[("NOREPEAT_ADMIN_TOKEN", "s3cret")]).await;
    for given in ["", "s3cre", "s3cret!", "S3CRET"] {
        let a = s
            .request(
                "PUT",
                "/admin/stock/SKU-1",
                &[
                    ("x-admin-token", given),
                    ("content-type", "application/json"),
                ],
                r#"{"available":5}"#,
            )
            .await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{given:?}");
    }
    let a = s
        .request(
            "PUT",
            "/admin/stock/SKU-1",
            &[
                ("x-admin-token", "s3cret"),
                ("content-type", "application/json"),
            ],
            r#"{"available":5}"#,
        )
        .await;
    assert_eq!(a.status, StatusCode::OK);
}

// ---- Signed callbacks ----------------------------------------------------

async fn callbacks_need_a_good_signature(backend: Backend) {
    let s = shop(backend, SIGNED).await;
    assert_eq!(
        s.request("GET", "/healthz", &[], "").await.body["callbacks"],
        "signed"
    );
    let order_id = s.order("buyer").await;
    let payment_id = s.payment("buyer", &order_id).await;
    let body = json!({"paymentId": payment_id, "status": "SUCCESS"}).to_string();
    let now = unix_now();

    let refused: Vec<(&str, String)> = vec![
        ("unsigned", String::new()),
        ("forged", sign_callback("guessed", now, body.as_bytes())),
        // A notice captured and replayed six minutes later.
        ("stale", sign_callback(SECRET, now - 360, body.as_bytes())),
        (
            "from the future",
            sign_callback(SECRET, now + 360, body.as_bytes()),
        ),
        (
            "other body",
            sign_callback(SECRET, now, br#"{"paymentId":"x","status":"SUCCESS"}"#),
        ),
        ("garbage", "t=now,v1=zz".into()),
    ];
    for (what, sig) in &refused {
        let mut h = vec![];
        if !sig.is_empty() {
            h.push(("norepeat-signature", sig.as_str()));
        }
        let a = s.post_json("/payments/callback", &h, &body).await;
        assert_eq!(a.code(), (401, "invalid_signature"), "{what}");
        if sig.is_empty() {
            // The answer names the header that is missing.
            let detail = a.body["detail"].as_str().unwrap();
            assert!(detail.contains("Norepeat-Signature"), "{detail}");
        }
    }
    let o = s.get(&format!("/orders/{order_id}"), "buyer").await;
    assert_eq!(
        o.body["status"], "UNPAID",
        "a refused notice changed nothing"
    );

    let good = sign_callback_now(SECRET, body.as_bytes());
    let a = s
        .post_json(
            "/payments/callback",
            &[("norepeat-signature", &good)],
            &body,
        )
        .await;
    assert_eq!(a.body, json!({"result": "applied"}));
    let o = s.get(&format!("/orders/{order_id}"), "buyer").await;
    assert_eq!(o.body["status"], "PAID");
    // The same signed notice resent within its window: the contract's
    // answer, not a signature-replay refusal.
    let again = s
        .post_json(
            "/payments/callback",
            &[("norepeat-signature", &good)],
            &body,
        )
        .await;
    assert_eq!(again.body, json!({"result": "already_applied"}));
}

#[tokio::test]
async fn callbacks_need_a_good_signature_sqlite() {
    callbacks_need_a_good_signature(Backend::Sqlite).await;
}

#[tokio::test]
async fn callbacks_need_a_good_signature_postgres() {
    callbacks_need_a_good_signature(Backend::Postgres).await;
}

#[tokio::test]
async fn without_a_secret_callbacks_are_unsigned_and_health_says_so() {
    let s = shop(Backend::Sqlite, &[]).await;
    assert_eq!(
        s.request("GET", "/healthz", &[], "").await.body["callbacks"],
        "unsigned"
    );
    let order_id = s.order("buyer").await;
    let payment_id = s.payment("buyer", &order_id).await;
    let body = json!({"paymentId": payment_id, "status": "SUCCESS"}).to_string();
    let a = s.post_json("/payments/callback", &[], &body).await;
    assert_eq!(a.body, json!({"result": "applied"}));
}

/// `POST /payments` is rate limited per user (`NOREPEAT_PAYMENT_RATE`) and
/// per client address (ten times that), before the Idempotency-Key layer
/// (a request without a key over the rate is 429, not 400), with the
/// headers of the contract.
#[tokio::test]
async fn payments_are_rate_limited_per_user_and_per_address() {
    let s = shop(Backend::Sqlite, &[("NOREPEAT_PAYMENT_RATE", "2/m")]).await;
    let pay = |user: String, key: Option<String>| {
        let mut b = s
            .http
            .post(format!("{}/payments", s.base))
            .header("x-user-id", user)
            .header("content-type", "application/json")
            .body(r#"{"orderId":"ord_none","amount":1999}"#);
        if let Some(k) = key {
            b = b.header("idempotency-key", k);
        }
        async move { b.send().await.unwrap() }
    };
    // Within the rate: the route answers (an unknown order, 404).
    for i in 0..2 {
        let res = pay("u1".into(), Some(format!("k{i}"))).await;
        assert_eq!(res.status(), StatusCode::NOT_FOUND);
    }
    let over = pay("u1".into(), None).await;
    assert_eq!(over.status(), StatusCode::TOO_MANY_REQUESTS);
    for h in ["retry-after", "ratelimit", "ratelimit-policy"] {
        assert!(over.headers().contains_key(h), "{h}: {:?}", over.headers());
    }
    let body: Value = over.json().await.unwrap();
    assert_eq!(body["code"], "rate_limited", "{body}");

    // Another user from the same address has a quota of their own, until
    // the address's (20 a minute) runs out.
    let mut refused = 0;
    for i in 0..25 {
        let res = pay(format!("v{i}"), Some("k".into())).await;
        match res.status() {
            StatusCode::NOT_FOUND => {}
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            other => panic!("v{i}: {other}"),
        }
    }
    assert!((5..=8).contains(&refused), "{refused} refused");
}

/// `NOREPEAT_CALLBACK_SECRET` set but blank: someone meant to sign the
/// callbacks, so the shop refuses to start and names the variable, rather
/// than serve them unsigned.
#[tokio::test]
async fn a_blank_callback_secret_stops_the_start() {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
    let dir = std::env::temp_dir().join(format!("nr-sec-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.join("shop.db").display());
    for blank in ["", "   ", "\t"] {
        let mut child = common::shop_command_async()
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env("DATABASE_URL", &url)
            .env("NOREPEAT_CALLBACK_SECRET", blank)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        // A shop that starts says so on stdout: then the test has failed
        // (and the child is killed on drop), with no need to wait for it.
        let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let deadline = std::time::Duration::from_secs(60);
        let first = tokio::time::timeout(deadline, stdout.next_line())
            .await
            .expect("the shop neither started nor stopped");
        assert_eq!(first.unwrap(), None, "{blank:?}: the shop started");
        let status = tokio::time::timeout(deadline, child.wait())
            .await
            .unwrap()
            .unwrap();
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .await
            .unwrap();
        assert!(!status.success(), "{blank:?}: {status}");
        assert!(
            stderr.contains("NOREPEAT_CALLBACK_SECRET is set but empty"),
            "{blank:?}: {stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The page's stand-in for the provider signs with the shop's secret, and
/// only when asked for: off, it is not there at all.
#[tokio::test]
async fn the_demo_provider_signs_and_is_off_by_default() {
    let off = shop(Backend::Sqlite, SIGNED).await;
    assert_eq!(
        off.request("GET", "/healthz", &[], "").await.body["demoProvider"],
        false
    );
    let order_id = off.order("buyer").await;
    let payment_id = off.payment("buyer", &order_id).await;
    let body = json!({"paymentId": payment_id, "status": "SUCCESS"}).to_string();
    let a = off.post_json("/demo/provider/notify", &[], &body).await;
    assert_eq!(a.code(), (404, "not_found"));
    let o = off.get(&format!("/orders/{order_id}"), "buyer").await;
    assert_eq!(o.body["status"], "UNPAID");

    let on = shop(
        Backend::Sqlite,
        &[
            ("NOREPEAT_CALLBACK_SECRET", SECRET),
            ("NOREPEAT_DEMO_PROVIDER", "true"),
        ],
    )
    .await;
    assert_eq!(
        on.request("GET", "/healthz", &[], "").await.body["demoProvider"],
        true
    );
    let order_id = on.order("buyer").await;
    let payment_id = on.payment("buyer", &order_id).await;
    let body = json!({"paymentId": payment_id, "status": "SUCCESS"}).to_string();
    // Unsigned, straight to the callback: still refused.
    let a = on.post_json("/payments/callback", &[], &body).await;
    assert_eq!(a.code(), (401, "invalid_signature"));
    // Through the demo provider: signed, applied once.
    let a = on.post_json("/demo/provider/notify", &[], &body).await;
    assert_eq!(a.body, json!({"result": "applied"}));
    let a = on.post_json("/demo/provider/notify", &[], &body).await;
    assert_eq!(a.body, json!({"result": "already_applied"}));
    let o = on.get(&format!("/orders/{order_id}"), "buyer").await;
    assert_eq!(o.body["status"], "PAID");
}

// ---- Ownership -----------------------------------------------------------

async fn another_users_order_is_not_found(backend: Backend) {
    let s = shop(backend, &[]).await;
    let id = s.order("alice").await;
    let mine = s.get(&format!("/orders/{id}"), "alice").await;
    assert_eq!(mine.body["orderId"], id.as_str());
    let theirs = s.get(&format!("/orders/{id}"), "mallory").await;
    assert_eq!(theirs.code(), (404, "not_found"));
    let unknown = s.get("/orders/ord_nope", "mallory").await;
    assert_eq!(
        theirs.body["detail"].as_str().map(|d| d.replace(&id, "X")),
        unknown.body["detail"]
            .as_str()
            .map(|d| d.replace("ord_nope", "X")),
        "another user's order reads exactly as an unknown one"
    );
    let anonymous = s.request("GET", &format!("/orders/{id}"), &[], "").await;
    assert_eq!(anonymous.code(), (401, "unauthenticated"));
    assert_eq!(s.get("/orders", "mallory").await.body["orders"], json!([]));
    assert_eq!(s.get("/points", "mallory").await.body["points"], 0);
}

#[tokio::test]
async fn another_users_order_is_not_found_sqlite() {
    another_users_order_is_not_found(Backend::Sqlite).await;
}

#[tokio::test]
async fn another_users_order_is_not_found_postgres() {
    another_users_order_is_not_found(Backend::Postgres).await;
}

// ---- Control characters --------------------------------------------------

async fn control_characters_are_refused(backend: Backend) {
    let s = shop(backend, &[("NOREPEAT_ADMIN_TOKEN", "admin")]).await;
    let user = [("x-user-id", "u1")];
    let token = s.get("/repeat/token", "u1").await.body["repeatToken"]
        .as_str()
        .unwrap()
        .to_owned();
    let order_id = s.order("u1").await;
    type Headers<'a> = Vec<(&'a str, &'a str)>;
    let bodies: Vec<(&str, Headers<'_>, String)> = vec![
        (
            "/orders/quick",
            user.to_vec(),
            r#"{"sku":"SKU-1\u0000","quantity":1}"#.into(),
        ),
        (
            "/orders/quick",
            user.to_vec(),
            r#"{"sku":"SKU-1","quantity":1,"bizId":"b\u001f"}"#.into(),
        ),
        (
            "/orders",
            vec![("x-user-id", "u1"), ("repeat-token", &token)],
            r#"{"sku":"SKU-1","quantity":1,"bizId":"\u0000"}"#.into(),
        ),
        (
            "/flash-sale/SKU-1",
            user.to_vec(),
            r#"{"quantity":1,"bizId":"x\u007f"}"#.into(),
        ),
        (
            "/payments",
            vec![("x-user-id", "u1"), ("idempotency-key", "k-nul")],
            format!(r#"{{"orderId":"{order_id}\u0000","amount":1}}"#),
        ),
        (
            "/payments/callback",
            vec![],
            r#"{"paymentId":"p\u0000","status":"SUCCESS"}"#.into(),
        ),
    ];
    for (path, headers, body) in &bodies {
        let a = s.post_json(path, headers, body).await;
        assert_eq!(a.code(), (400, "invalid_request"), "{path} {body}");
    }
    for (method, path) in [
        ("GET", "/orders/%00"),
        ("GET", "/orders/ord%0A"),
        ("GET", "/orders/%7F"),
        ("GET", "/stock/%00"),
        ("GET", "/stock/SKU-1%1B"),
        ("GET", "/orders/%FF"),
        ("PUT", "/admin/stock/%00"),
        ("POST", "/flash-sale/%00"),
    ] {
        let a = s
            .request(
                method,
                path,
                &[
                    ("x-user-id", "u1"),
                    ("x-admin-token", "admin"),
                    ("content-type", "application/json"),
                ],
                r#"{"available":1,"quantity":1}"#,
            )
            .await;
        assert_eq!(a.code(), (400, "invalid_request"), "{method} {path}");
    }
    // Nothing was written, and the shop still serves.
    assert_eq!(
        s.get("/orders", "u1").await.body["orders"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(s.get("/stock/SKU-1", "u1").await.body["available"], 99);
}

#[tokio::test]
async fn control_characters_are_refused_sqlite() {
    control_characters_are_refused(Backend::Sqlite).await;
}

#[tokio::test]
async fn control_characters_are_refused_postgres() {
    control_characters_are_refused(Backend::Postgres).await;
}

// ---- Canonical JSON --------------------------------------------------------

#[tokio::test]
async fn one_and_one_point_zero_are_the_same_submission() {
    let s = shop(Backend::Sqlite, &[]).await;
    let user = [("x-user-id", "u1")];
    let a = s
        .post_json("/orders/quick", &user, r#"{"sku":"SKU-2","quantity":1}"#)
        .await;
    assert_eq!(a.status, StatusCode::CREATED);
    // A client that re-serialises its retry writes the number differently.
    let b = s
        .post_json("/orders/quick", &user, r#"{"quantity":1.0,"sku":"SKU-2"}"#)
        .await;
    assert_eq!(b.code(), (409, "duplicate_submission"));
    assert_eq!(s.get("/stock/SKU-2", "u1").await.body["available"], 99);
}

#[tokio::test]
async fn duplicate_keys_are_invalid() {
    let s = shop(Backend::Sqlite, &[]).await;
    let token = s.get("/repeat/token", "u1").await.body["repeatToken"]
        .as_str()
        .unwrap()
        .to_owned();
    let body = r#"{"sku":"SKU-1","quantity":1,"quantity":100}"#;
    let a = s
        .post_json("/orders/quick", &[("x-user-id", "u1")], body)
        .await;
    assert_eq!(a.code(), (400, "invalid_request"), "fingerprint route");
    let a = s
        .post_json(
            "/orders",
            &[("x-user-id", "u1"), ("repeat-token", &token)],
            body,
        )
        .await;
    assert_eq!(a.code(), (400, "invalid_request"), "token route");
    // Without a JSON content type the guard hashes bytes; the handler still
    // refuses.
    let a = s
        .request(
            "POST",
            "/orders/quick",
            &[("x-user-id", "u2")],
            r#"{"sku":"SKU-1","sku":"SKU-2","quantity":1}"#,
        )
        .await;
    assert_eq!(a.code(), (400, "invalid_request"), "no content type");
    assert_eq!(s.get("/stock/SKU-1", "u1").await.body["available"], 100);
}
