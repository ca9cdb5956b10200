// Over 400 lines on purpose: every idempotency answer through the binary, sharing its helpers.
//! Idempotency routes through the binary: replays byte for byte, unknown
//! outcomes (timeouts, broken answers, a backend's 500, a gateway killed
//! mid-request), keys per caller and per site, two instances on one store.

use crate::common::*;

#[tokio::test]
async fn an_idempotency_replay_is_the_first_answer_byte_for_byte() {
    let b = backend(0).await;
    let g = gateway(&file(&b, "memory", ROUTES)).await;
    let c = Client::new();
    let pay = || {
        c.post(url(&g, "/payments"))
            .header("x-user-id", "u1")
            .header("idempotency-key", "k-1")
            .header("content-type", "application/json")
            .body(r#"{"amount":1999}"#)
            .send()
    };
    let first = pay().await.unwrap();
    assert_eq!(first.status(), 201);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first_body = first.bytes().await.unwrap();
    let again = pay().await.unwrap();
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.bytes().await.unwrap(), first_body);
    assert_eq!(effects(&b).await["/payments"], 1);
}

#[tokio::test]
async fn two_instances_on_one_redis_catch_a_repeat_across_them() {
    let redis = RedisServer::start().await;
    let b = backend(0).await;
    let yaml = file(&b, &redis.url(), ROUTES);
    let (g1, g2) = (gateway(&yaml).await, gateway(&yaml).await);
    let c = Client::new();
    let send = |g: &Process| {
        c.post(url(g, "/orders/quick"))
            .header("x-user-id", "u1")
            .header("content-type", "application/json")
            .body(r#"{"sku":"b2"}"#)
            .send()
    };
    assert_eq!(send(&g1).await.unwrap().status(), 201);
    assert_eq!(
        code(send(&g2).await.unwrap()).await,
        (StatusCode::CONFLICT, "duplicate_submission".into())
    );
    // A token issued by one instance is consumed on the other (the random
    // secret is shared through the store), once.
    let token = token_for(&g1, "u1").await;
    let order = |g: &Process| {
        c.post(url(g, "/orders"))
            .header("x-user-id", "u1")
            .header("repeat-token", token["repeatToken"].as_str().unwrap())
            .send()
    };
    assert_eq!(order(&g2).await.unwrap().status(), 201);
    assert_eq!(order(&g1).await.unwrap().status(), 409);
    let e = effects(&b).await;
    assert_eq!(
        (e["/orders/quick"].clone(), e["/orders"].clone()),
        (1.into(), 1.into())
    );
}

#[tokio::test]
async fn backend_down_is_502_and_the_retry_runs_once_it_is_up() {
    let port = free_port();
    // Nothing listens on `port` yet.
    let g = gateway(&file_for(port, "memory", ROUTES)).await;
    let c = Client::new();
    let pay = || {
        c.post(url(&g, "/payments"))
            .header("x-user-id", "u1")
            .header("idempotency-key", "k-down")
            .body("{}")
            .send()
    };
    assert_eq!(
        code(pay().await.unwrap()).await,
        (StatusCode::BAD_GATEWAY, "upstream_unavailable".into())
    );
    let b = backend(port).await;
    assert_eq!(pay().await.unwrap().status(), 201, "the key was released");
    assert_eq!(effects(&b).await["/payments"], 1);
}

#[tokio::test]
async fn a_backend_past_its_timeout_is_504_and_the_retry_never_runs_it_again() {
    let b = backend(0).await;
    let g = gateway(&file(&b, "memory", ROUTES)).await;
    let c = Client::new();
    let pay = |path: &'static str| {
        c.post(url(&g, path))
            .header("x-user-id", "u1")
            .header("idempotency-key", "k-slow")
            .header("x-delay", "1.5")
            .body("{}")
            .send()
    };
    assert_eq!(
        code(pay("/payments").await.unwrap()).await,
        (StatusCode::GATEWAY_TIMEOUT, "upstream_timeout".into())
    );
    assert_eq!(
        code(pay("/payments").await.unwrap()).await,
        (StatusCode::CONFLICT, "idempotency_outcome_unknown".into())
    );
    // `ambiguous: release`: the retry runs again.
    assert_eq!(
        code(pay("/refunds").await.unwrap()).await.0,
        StatusCode::GATEWAY_TIMEOUT
    );
    assert_eq!(
        code(pay("/refunds").await.unwrap()).await.0,
        StatusCode::GATEWAY_TIMEOUT
    );
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(
        code(pay("/payments").await.unwrap()).await.1,
        "idempotency_outcome_unknown",
        "still refused once the first has ended"
    );
    let e = effects(&b).await;
    assert_eq!(e["/payments"], 1, "never twice: {e}");
    assert_eq!(e["/refunds"], 2, "release lets the retry run: {e}");
    // The retry is the second attempt: the first reached the backend
    // (issue 52, item 6: it came as attempt 1 again).
    let seen = attempts(&b, "/refunds").await;
    assert_eq!(seen, [serde_json::json!("1"), serde_json::json!("2")]);
}

#[tokio::test]
async fn an_answer_too_large_to_store_is_streamed_whole_and_replayed_without_its_body() {
    let b = backend(0).await;
    let g = gateway(&file(&b, "memory", ROUTES)).await;
    let c = Client::new();
    let pay = || {
        c.post(url(&g, "/payments"))
            .header("x-user-id", "u1")
            .header("idempotency-key", "k-big")
            .header("x-big", "1")
            .body("{}")
            .send()
    };
    let first = pay().await.unwrap();
    assert_eq!(first.status(), 201);
    assert_eq!(first.bytes().await.unwrap().len(), 2 * 1024 * 1024);
    let again = pay().await.unwrap();
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["idempotent-body"], "omitted");
    assert!(again.bytes().await.unwrap().is_empty());
    assert_eq!(effects(&b).await["/payments"], 1);
}

/// A client that gives up half-way through a payment whose backend then
/// times out: the upstream call goes on without it, its unknown outcome is
/// recorded, and the retry is refused with 409 `idempotency_outcome_unknown`
/// (never run again), on this instance and on another one sharing Redis.
#[tokio::test]
async fn a_client_that_leaves_before_an_unknown_outcome_cannot_run_it_again() {
    let redis = RedisServer::start().await;
    let b = backend(0).await;
    let yaml = file(&b, &redis.url(), ROUTES);
    let (g1, g2) = (gateway(&yaml).await, gateway(&yaml).await);
    let impatient = Client::builder()
        .timeout(Duration::from_millis(150))
        .build()
        .unwrap();
    let first = impatient
        .post(url(&g1, "/payments"))
        .header("x-user-id", "u1")
        .header("idempotency-key", "k-left")
        .header("x-delay", "1.5")
        .body("{}")
        .send()
        .await;
    assert!(first.is_err(), "the client gave up: {first:?}");
    let c = Client::new();
    let retry = |g: &Process| {
        c.post(url(g, "/payments"))
            .header("x-user-id", "u1")
            .header("idempotency-key", "k-left")
            .body("{}")
            .send()
    };
    // 409 in use while the call runs, then the recorded unknown outcome.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut last = code(retry(&g2).await.unwrap()).await;
    while last.1 == "idempotency_key_in_use" {
        assert!(tokio::time::Instant::now() < deadline, "still in use");
        tokio::time::sleep(Duration::from_millis(50)).await;
        last = code(retry(&g2).await.unwrap()).await;
    }
    assert_eq!(
        last,
        (StatusCode::CONFLICT, "idempotency_outcome_unknown".into())
    );
    assert_eq!(
        code(retry(&g1).await.unwrap()).await,
        (StatusCode::CONFLICT, "idempotency_outcome_unknown".into())
    );
    assert_eq!(effects(&b).await["/payments"], 1);
}

/// A backend that sends its head and then stalls does not hold the key for
/// ever: past the route's timeout without a frame, the answer did not come
/// within `timeout`, so the outcome is unknown: 504 `upstream_timeout` to
/// the client, and a retry gets 409 `idempotency_outcome_unknown` (one
/// effect) instead of 409 `idempotency_key_in_use` for as long as the
/// backend stalls.
#[tokio::test]
async fn a_backend_that_stalls_its_body_does_not_hold_the_key() {
    let b = backend(0).await;
    let g = gateway(&file(&b, "memory", ROUTES)).await;
    let c = Client::new();
    let pay = |stall: bool| {
        let mut req = c
            .post(url(&g, "/payments"))
            .header("x-user-id", "u1")
            .header("idempotency-key", "k-stall")
            .body("{}");
        if stall {
            req = req.header("x-stall", "1");
        }
        req.send()
    };
    assert_eq!(
        code(pay(true).await.unwrap()).await,
        (StatusCode::GATEWAY_TIMEOUT, "upstream_timeout".into())
    );
    // The record is written before the client's answer: no waiting.
    assert_eq!(
        code(pay(false).await.unwrap()).await,
        (StatusCode::CONFLICT, "idempotency_outcome_unknown".into()),
        "not held as in use by the stalled answer"
    );
    assert_eq!(effects(&b).await["/payments"], 1);
}

/// Item 1 of issue 26: a replay carries the first answer's headers (the
/// backend's own `X-Order`, `X-Backend`), but never its `Set-Cookie`.
#[tokio::test]
async fn a_replay_carries_the_first_answers_headers_but_never_set_cookie() {
    let b = backend(0).await;
    let g = gateway(&file(&b, "memory", ROUTES)).await;
    let c = Client::new();
    let pay = || {
        c.post(url(&g, "/payments"))
            .header("x-user-id", "u1")
            .header("idempotency-key", "k-headers")
            .body("{}")
            .send()
    };
    let first = pay().await.unwrap();
    assert_eq!(first.status(), 201);
    assert_eq!(first.headers()["x-order"], "1");
    assert!(
        first.headers().get("set-cookie").is_some(),
        "the first answer is passed on as it is"
    );
    let again = pay().await.unwrap();
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["x-order"], "1", "{:?}", again.headers());
    assert_eq!(again.headers()["x-backend"], "py");
    assert_eq!(again.headers()["content-type"], "application/json");
    assert!(
        again.headers().get("set-cookie").is_none(),
        "a replay hands out no session: {:?}",
        again.headers()
    );
    assert_eq!(effects(&b).await["/payments"], 1);
}

/// Item 6 of issue 26: on a Redis Cluster, two gateway instances share the
/// idempotency records (a retry on the other replays) and the token
/// secret (a token issued by one is consumed once, on the other).
#[tokio::test]
async fn two_instances_on_a_redis_cluster_share_records_and_tokens() {
    let cluster = norepeat_testkit::RedisCluster::start().await;
    let b = backend(0).await;
    let yaml = file(&b, &cluster.url(), ROUTES);
    let (g1, g2) = (gateway(&yaml).await, gateway(&yaml).await);
    let c = Client::new();
    let pay = |g: &Process| {
        c.post(url(g, "/payments"))
            .header("x-user-id", "u1")
            .header("idempotency-key", "k-cluster")
            .body("{}")
            .send()
    };
    let first = pay(&g1).await.unwrap();
    assert_eq!(first.status(), 201);
    let first_body = first.bytes().await.unwrap();
    let again = pay(&g2).await.unwrap();
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["x-order"], "1");
    assert_eq!(again.bytes().await.unwrap(), first_body);
    let token = token_for(&g1, "u1").await;
    let order = |g: &Process| {
        c.post(url(g, "/orders"))
            .header("x-user-id", "u1")
            .header("repeat-token", token["repeatToken"].as_str().unwrap())
            .send()
    };
    assert_eq!(order(&g2).await.unwrap().status(), 201);
    assert_eq!(
        code(order(&g1).await.unwrap()).await,
        (StatusCode::CONFLICT, "duplicate_submission".into())
    );
    let health = health(&g2).await;
    assert_eq!(health["store"], "cluster", "{health}");
    let e = effects(&b).await;
    assert_eq!(
        (e["/payments"].clone(), e["/orders"].clone()),
        (1.into(), 1.into()),
        "{e}"
    );
}

/// Item 7 of issue 26: a backend that dies half-way through its answer
/// (head sent, part of the body, connection closed). On an idempotency
/// route the outcome is unknown: 504 to the client, and with `ambiguous:
/// keep` every retry is 409 `idempotency_outcome_unknown` (the backend ran
/// once); with `release` the retry runs again. On an unguarded route the
/// client sees the stream break, and the gateway goes on serving.
#[tokio::test]
async fn a_backend_that_breaks_its_answer_is_an_unknown_outcome() {
    let b = backend(0).await;
    let g = gateway(&file(&b, "memory", ROUTES)).await;
    let c = Client::new();
    let pay = |path: &'static str, broken: bool| {
        let mut r = c
            .post(url(&g, path))
            .header("x-user-id", "u1")
            .header("idempotency-key", "k-break")
            .body("{}");
        if broken {
            r = r.header("x-break", "1");
        }
        r.send()
    };
    assert_eq!(
        code(pay("/payments", true).await.unwrap()).await,
        (StatusCode::GATEWAY_TIMEOUT, "upstream_timeout".into())
    );
    for _ in 0..2 {
        let retry = pay("/payments", false).await.unwrap();
        assert_eq!(
            code(retry).await,
            (StatusCode::CONFLICT, "idempotency_outcome_unknown".into())
        );
    }
    assert_eq!(
        code(pay("/refunds", true).await.unwrap()).await.0,
        StatusCode::GATEWAY_TIMEOUT
    );
    assert_eq!(
        pay("/refunds", false).await.unwrap().status(),
        201,
        "released: runs again"
    );
    let e = effects(&b).await;
    assert_eq!(
        (e["/payments"].clone(), e["/refunds"].clone()),
        (1.into(), 2.into()),
        "{e}"
    );
    // Unguarded: the truncated stream is the client's error, not a panic.
    match c.get(url(&g, "/break")).send().await {
        Err(e) => assert!(e.is_request() || e.is_body(), "{e}"),
        Ok(res) => {
            assert_eq!(res.status(), 201);
            assert!(res.bytes().await.is_err(), "the body broke off");
        }
    }
    let health = c.get(url(&g, "/.norepeat/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200, "still serving");
}

/// The lease of an idempotency claim (the library's default: the file does
/// not set it).
const LEASE: Duration = Duration::from_secs(10);

/// Instance A of two on one Redis takes a payment to a slow backend and is
/// killed with `SIGKILL` while the backend runs it (an OOM kill, a node
/// lost); the backend finishes the charge. Retries on instance B: `409
/// idempotency_key_in_use` while the lease lasts, then (the claim's
/// deadline passed) 409 `idempotency_outcome_unknown` under `ambiguous:
/// keep`, never a second charge. Before, the claim ended with its lease and
/// the retry after it got 201 and charged again.
#[tokio::test]
async fn a_gateway_killed_mid_request_leaves_an_unknown_outcome_never_run_again() {
    let path = "/payments";
    let (_redis, b, gb) = killed_mid_request(path).await;
    tokio::time::sleep(LEASE + Duration::from_millis(500)).await;
    for _ in 0..2 {
        assert_eq!(
            code(pay_on(&gb, path, "k-killed").await).await,
            (StatusCode::CONFLICT, "idempotency_outcome_unknown".into())
        );
    }
    assert_eq!(effects(&b).await[path], 1, "charged twice");
    assert_eq!(attempts(&b, path).await, [Value::from("1")]);
}

/// The same under `ambiguous: release`: once the lease has passed, the
/// retry on B takes the abandoned claim over and reaches the backend as
/// `Idempotency-Attempt: 2` (the first came as 1), so the backend can tell.
#[tokio::test]
async fn a_gateway_killed_mid_request_is_taken_over_as_attempt_2_under_release() {
    let path = "/refunds";
    let (_redis, b, gb) = killed_mid_request(path).await;
    let deadline = tokio::time::Instant::now() + LEASE + Duration::from_secs(15);
    let retry = loop {
        let res = pay_on(&gb, path, "k-killed").await;
        if res.status() != StatusCode::CONFLICT {
            break res;
        }
        assert!(tokio::time::Instant::now() < deadline, "never taken over");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(
        attempts(&b, path).await,
        [Value::from("1"), Value::from("2")]
    );
    let replay = pay_on(&gb, path, "k-killed").await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(effects(&b).await[path], 2);
}

/// Two gateways on one private Redis; A takes `path` with a backend that
/// takes 3 s, and is killed once the backend has the request. Answers
/// Redis, the backend and B; B's immediate retry has been checked (409 in
/// use).
async fn killed_mid_request(path: &str) -> (RedisServer, Process, Process) {
    let redis = RedisServer::start().await;
    let b = backend(0).await;
    let routes = "
  - match: POST /payments
    guard: idempotency
  - match: POST /refunds
    guard: idempotency
    ambiguous: release
";
    let yaml = file(&b, &redis.url(), routes);
    let (mut ga, gb) = (gateway(&yaml).await, gateway(&yaml).await);
    let first = {
        let u = url(&ga, path);
        tokio::spawn(async move {
            Client::new()
                .post(u)
                .header("x-user-id", "u1")
                .header("idempotency-key", "k-killed")
                .header("x-delay", "3")
                .body("{}")
                .send()
                .await
        })
    };
    arrived(&b, path).await;
    ga.process.kill();
    assert!(first.await.unwrap().is_err(), "the killed gateway answered");
    assert_eq!(
        code(pay_on(&gb, path, "k-killed").await).await,
        (StatusCode::CONFLICT, "idempotency_key_in_use".into())
    );
    // The backend finishes the charge it was given.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(effects(&b).await[path], 1);
    (redis, b, gb)
}

/// Under `ambiguous: keep`, the backend's own 500 or 504 is an unknown
/// outcome: the client gets the backend's answer, a retry 409
/// `idempotency_outcome_unknown`, and the backend runs once. Its 502 and 503
/// free the key (the retry runs). Before, a 500 freed the key and the retry
/// ran the payment a second time.
#[tokio::test]
async fn a_backends_own_500_is_an_unknown_outcome_under_keep() {
    let b = backend(0).await;
    let g = gateway(&file(&b, "memory", ROUTES)).await;
    let c = Client::new();
    let pay = |key: &'static str, status: &'static str| {
        c.post(url(&g, "/payments"))
            .header("x-user-id", "u1")
            .header("idempotency-key", key)
            .header("x-status", status)
            .body("{}")
            .send()
    };
    for (key, status) in [("k-500", "500"), ("k-504", "504")] {
        let first = pay(key, status).await.unwrap();
        assert_eq!(first.status().as_u16().to_string(), status);
        assert!(first.headers().get("norepeat-gateway-outcome").is_none());
        let body: Value = first.json().await.unwrap();
        assert_eq!(body["path"], "/payments", "the backend's own answer");
        assert_eq!(
            code(pay(key, "201").await.unwrap()).await,
            (StatusCode::CONFLICT, "idempotency_outcome_unknown".into())
        );
    }
    assert_eq!(effects(&b).await["/payments"], 2, "one run per key");
    for (key, status) in [("k-502", "502"), ("k-503", "503")] {
        assert_eq!(
            pay(key, status)
                .await
                .unwrap()
                .status()
                .as_u16()
                .to_string(),
            status
        );
        assert_eq!(
            pay(key, "201").await.unwrap().status(),
            201,
            "{status} frees the key"
        );
    }
    assert_eq!(effects(&b).await["/payments"], 6);
    // `ambiguous: release` keeps the library's rule: a 500 frees the key.
    let refund = |status: &'static str| {
        c.post(url(&g, "/refunds"))
            .header("x-user-id", "u1")
            .header("idempotency-key", "k-r500")
            .header("x-status", status)
            .body("{}")
            .send()
    };
    assert_eq!(refund("500").await.unwrap().status(), 500);
    assert_eq!(refund("201").await.unwrap().status(), 201);
    assert_eq!(effects(&b).await["/refunds"], 2);
}

/// Every request forwarded on an idempotency route carries
/// `Idempotency-Attempt: 1` on its first attempt, whatever the client
/// sent; no other route forwards a client's `Idempotency-Attempt`.
#[tokio::test]
async fn the_backend_is_told_the_attempt_and_the_client_cannot_forge_it() {
    let b = backend(0).await;
    let g = gateway(&file(&b, "memory", ROUTES)).await;
    let c = Client::new();
    let res = c
        .post(url(&g, "/payments"))
        .header("x-user-id", "u1")
        .header("idempotency-key", "k-attempt")
        .header("idempotency-attempt", "7")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let res = c
        .post(url(&g, "/orders/quick"))
        .header("x-user-id", "u1")
        .header("idempotency-attempt", "7")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    assert_eq!(attempts(&b, "/payments").await, [Value::from("1")]);
    assert_eq!(attempts(&b, "/orders/quick").await, [Value::Null]);
}

/// Issue 37, item 3: keys are scoped by the site (`Host`) as well as the
/// caller. Before, user `42` with key `checkout-7` on `b.shop.example` got
/// `a.shop.example`'s stored answer, and b's payment never ran; and the
/// same order from user 42 on two sites was one fingerprint. Spellings of
/// one site (case, a trailing dot, its default port) stay one scope.
#[tokio::test]
async fn keys_are_scoped_by_host_as_well_as_by_caller() {
    let b = backend(0).await;
    let routes = "
  - match: POST /pay
    guard: idempotency
  - match: POST /orders/quick
    guard: fingerprint
    window: 1m
";
    let g = gateway(&file(&b, "memory", routes)).await;
    let pay = |host: &'static str| {
        Client::new()
            .post(url(&g, "/pay"))
            .header("host", host)
            .header("x-user-id", "42")
            .header("idempotency-key", "checkout-7")
            .body("{}")
            .send()
    };
    let seen_host = |v: &Value| v["host"].as_str().unwrap_or_default().to_owned();
    let a: Value = pay("a.shop.example").await.unwrap().json().await.unwrap();
    assert_eq!(seen_host(&a), "a.shop.example", "{a}");
    let first_b = pay("b.shop.example").await.unwrap();
    assert!(
        first_b.headers().get("idempotent-replayed").is_none(),
        "b got a's stored answer"
    );
    let first_b: Value = first_b.json().await.unwrap();
    assert_eq!(seen_host(&first_b), "b.shop.example", "{first_b}");
    for (spelling, site) in [
        ("B.Shop.Example.", "b.shop.example"),
        ("b.shop.example:80", "b.shop.example"),
        ("A.SHOP.EXAMPLE", "a.shop.example"),
    ] {
        let res = pay(spelling).await.unwrap();
        assert_eq!(res.headers()["idempotent-replayed"], "true", "{spelling}");
        let v: Value = res.json().await.unwrap();
        assert_eq!(seen_host(&v), site, "{spelling} got another site's answer");
    }
    assert_eq!(effects(&b).await["/pay"], 2, "one payment per site");

    let order = |host: &'static str| {
        Client::new()
            .post(url(&g, "/orders/quick"))
            .header("host", host)
            .header("x-user-id", "42")
            .header("content-type", "application/json")
            .body(r#"{"sku":"s1"}"#)
            .send()
    };
    assert_eq!(order("a.shop.example").await.unwrap().status(), 201);
    assert_eq!(order("b.shop.example").await.unwrap().status(), 201);
    assert_eq!(order("a.shop.example.").await.unwrap().status(), 409);
}

/// Issue 51, item 8: a fresh key costs the claim and the completion, no
/// more: the read of the same key under the caller alone that eased an
/// upgrade from a release never published is gone (it cost every fresh
/// key a `GET` for a day after each new install).
#[tokio::test]
async fn a_fresh_key_costs_no_read_of_another_key() {
    let redis = RedisServer::start().await;
    let b = backend(0).await;
    let g = gateway(&file(&b, &redis.url(), ROUTES)).await;
    let mut conn = redis.connection().await;
    let calls = |info: &str, cmd: &str| -> u64 {
        let prefix = format!("cmdstat_{cmd}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|v| v.split(',').next()?.parse().ok())
            .unwrap_or(0)
    };
    // The GETs sent by a client: each script (a completion, a probe) runs
    // one GET inside it, which Redis counts among the GETs too.
    let gets = |info: &str| {
        i128::from(calls(info, "get")) - i128::from(calls(info, "evalsha") + calls(info, "eval"))
    };
    // Warm: the scripts loaded on the connection.
    assert_eq!(pay_on(&g, "/payments", "warm").await.status(), 201);
    let before: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    for i in 0..10 {
        assert_eq!(
            pay_on(&g, "/payments", &format!("fresh-{i}"))
                .await
                .status(),
            201
        );
    }
    let after: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(gets(&after) - gets(&before) <= 0, "{before}\n{after}");
}

/// Issue 40, item 4: an idempotency key is the caller's (u1 and u2 with
/// one key are two payments), a key that is not one is 400
/// `invalid_idempotency_key` and reaches nothing, a route's own
/// `max_stored_response` holds (an answer over it replays without its
/// body, `Idempotent-Body: omitted`), and the 409 of an unknown outcome
/// ends when `retention` ends (the record is gone; the key runs again).
#[tokio::test]
async fn idempotency_keys_are_per_caller_checked_capped_and_end_with_retention() {
    let b = backend(0).await;
    let routes = "
  - match: POST /payments
    guard: idempotency
    max_stored_response: 32
  - match: POST /short
    guard: idempotency
    retention: 2s
    timeout: 500ms
";
    let g = gateway(&file(&b, "memory", routes)).await;
    let c = Client::new();
    let pay = |path: &'static str, user: &'static str, key: &str, delay: &'static str| {
        c.post(url(&g, path))
            .header("x-user-id", user)
            .header("idempotency-key", key.to_owned())
            .header("x-delay", delay)
            .body("{}")
            .send()
    };
    let first = pay("/payments", "u1", "k1", "0").await.unwrap();
    assert_eq!(first.status(), 201);
    let whole = first.text().await.unwrap();
    assert!(
        whole.len() > 32,
        "the backend's answer is over the cap: {whole}"
    );
    assert_eq!(
        pay("/payments", "u2", "k1", "0").await.unwrap().status(),
        201
    );
    assert_eq!(
        effects(&b).await["/payments"],
        2,
        "one key, two callers, two payments"
    );
    let replay = pay("/payments", "u1", "k1", "0").await.unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.headers()["idempotent-body"], "omitted");
    assert_eq!(replay.text().await.unwrap(), "", "stored without its body");
    for bad in [&"k".repeat(300), "has space", "ünïcode"] {
        let res = c
            .post(url(&g, "/payments"))
            .header("x-user-id", "u1")
            .header("idempotency-key", bad.as_bytes())
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(
            code(res).await,
            (StatusCode::BAD_REQUEST, "invalid_idempotency_key".into()),
            "{bad:?}"
        );
    }
    assert_eq!(effects(&b).await["/payments"], 2);

    assert_eq!(
        code(pay("/short", "u1", "k2", "1").await.unwrap()).await.1,
        "upstream_timeout"
    );
    assert_eq!(
        code(pay("/short", "u1", "k2", "0").await.unwrap()).await.1,
        "idempotency_outcome_unknown"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let res = pay("/short", "u1", "k2", "0").await.unwrap();
        if res.status() == StatusCode::CREATED {
            break;
        }
        assert_eq!(code(res).await.1, "idempotency_outcome_unknown");
        assert!(
            tokio::time::Instant::now() < deadline,
            "the 409 never ended"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        effects(&b).await["/short"],
        2,
        "run again once the retention ended"
    );
}
