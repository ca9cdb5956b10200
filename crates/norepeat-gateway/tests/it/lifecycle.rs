// Over 400 lines on purpose: the gateway's signals, reloads and store loss, sharing process helpers.
//! The gateway's life: signals (drain, grace), reloads, a store that is
//! down at start or killed, health and help.

use crate::common::*;

#[tokio::test]
async fn sigterm_finishes_the_request_in_flight_then_exits_0() {
    let b = backend(0).await;
    let mut g = gateway(&file(&b, "memory", ROUTES)).await;
    let c = Client::new();
    let slow = tokio::spawn(
        c.post(url(&g, "/slow"))
            .header("x-delay", "2")
            .body("{}")
            .send(),
    );
    // In flight once the backend has counted it (it counts before its
    // delay), not after a fixed sleep a busy machine can overrun.
    arrived(&b, "/slow").await;
    g.signal("-TERM").await;
    let res = slow
        .await
        .unwrap()
        .expect("the request in flight is answered");
    assert_eq!(res.status(), 201);
    let status = g
        .process
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("exits within 10 s");
    assert_eq!(status.code(), Some(0));
    assert!(
        c.get(url(&g, "/echo")).send().await.is_err(),
        "no longer accepting"
    );
}

/// SIGTERM waits for the upstream call of a client that already left, so
/// its answer is recorded: after the restart, the retry (on a new instance
/// sharing Redis) gets the replay, not a claim left open for its lease.
#[tokio::test]
async fn sigterm_lets_a_left_clients_upstream_call_complete_its_record() {
    let redis = RedisServer::start().await;
    let b = backend(0).await;
    let yaml = file(&b, &redis.url(), ROUTES);
    let mut g1 = gateway(&yaml).await;
    let impatient = Client::builder()
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let first = impatient
        .post(url(&g1, "/payments"))
        .header("x-user-id", "u1")
        .header("idempotency-key", "k-term")
        .header("x-delay", "0.4")
        .body("{}")
        .send()
        .await;
    assert!(first.is_err(), "the client gave up: {first:?}");
    assert_eq!(effects(&b).await["/payments"], 1, "the call is running");
    g1.signal("-TERM").await;
    let exit = g1
        .process
        .wait_exit(Duration::from_secs(15))
        .await
        .expect("exits within its grace");
    assert_eq!(exit.code(), Some(0));
    let g2 = gateway(&yaml).await;
    let res = Client::new()
        .post(url(&g2, "/payments"))
        .header("x-user-id", "u1")
        .header("idempotency-key", "k-term")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201, "the recorded answer");
    assert_eq!(res.headers()["idempotent-replayed"], "true");
    assert_eq!(effects(&b).await["/payments"], 1);
}

/// A payment still waiting on its backend when SIGTERM's grace is over
/// ends as an unknown outcome, recorded for its key before the exit: its
/// client gets 504, and after the restart the retry is answered 409
/// `idempotency_outcome_unknown` without reaching the backend. (Dropped
/// with the process, the call left its claim to end with its lease, and
/// the retry then ran the payment a second time.)
#[tokio::test]
async fn sigterm_past_the_grace_records_an_unknown_outcome_never_run_again() {
    let redis = RedisServer::start().await;
    let b = backend(0).await;
    let routes = "
  - match: POST /slowpay
    guard: idempotency
    timeout: 60s
";
    let yaml = file(&b, &redis.url(), routes);
    let mut g1 = gateway(&yaml).await;
    let c = Client::new();
    let first = tokio::spawn(
        c.post(url(&g1, "/slowpay"))
            .header("x-user-id", "u1")
            .header("idempotency-key", "k-grace")
            .header("x-delay", "30")
            .body("{}")
            .send(),
    );
    arrived(&b, "/slowpay").await;
    g1.signal("-TERM").await;
    let res = first
        .await
        .unwrap()
        .expect("answered before the gateway exits");
    assert_eq!(
        code(res).await,
        (StatusCode::GATEWAY_TIMEOUT, "upstream_timeout".into())
    );
    let exit = g1
        .process
        .wait_exit(Duration::from_secs(25))
        .await
        .expect("exits after its grace");
    assert_eq!(exit.code(), Some(0));

    let g2 = gateway(&yaml).await;
    let retry = c
        .post(url(&g2, "/slowpay"))
        .header("x-user-id", "u1")
        .header("idempotency-key", "k-grace")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(
        code(retry).await,
        (StatusCode::CONFLICT, "idempotency_outcome_unknown".into())
    );
    assert_eq!(effects(&b).await["/slowpay"], 1, "the payment ran again");
}

#[tokio::test]
async fn redis_killed_fails_each_route_its_way_and_restarted_serves_again() {
    let mut redis = RedisServer::start().await;
    let b = backend(0).await;
    let g = gateway(&file(&b, &redis.url(), ROUTES)).await;
    let c = Client::new();
    let quick = || {
        c.post(url(&g, "/orders/quick"))
            .header("x-user-id", "u1")
            .header("content-type", "application/json")
            .body(format!(r#"{{"n":{}}}"#, rand_n()))
            .send()
    };
    let pay = |key: &'static str| {
        c.post(url(&g, "/payments"))
            .header("x-user-id", "u1")
            .header("idempotency-key", key)
            .body("{}")
            .send()
    };
    assert_eq!(
        c.get(url(&g, "/.norepeat/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    redis.kill();
    assert_eq!(
        quick().await.unwrap().status(),
        201,
        "fingerprint fails open"
    );
    assert_eq!(
        code(pay("k-r1").await.unwrap()).await,
        (StatusCode::SERVICE_UNAVAILABLE, "guard_unavailable".into())
    );
    // Issue 38: a store every instance shares takes no instance out of the
    // load balancer (before: 503 here, so every instance went unready at
    // once); healthz says what refuses.
    assert_eq!(
        c.get(url(&g, "/.norepeat/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let h = health_once(&g, "store_answers", false.into()).await;
    assert_eq!(
        h["refusing"],
        serde_json::json!(["POST /payments", "POST /refunds", "GET /spoof"]),
        "{h}"
    );
    redis.restart().await;
    let mut last = StatusCode::OK;
    for _ in 0..50 {
        last = pay("k-r2").await.unwrap().status();
        if last == StatusCode::CREATED {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(last, StatusCode::CREATED, "serves again once Redis is back");
    assert_eq!(
        effects(&b).await["/payments"],
        1,
        "the refused payment never ran"
    );
}

#[tokio::test]
async fn a_changed_file_replaces_the_routes_and_a_bad_one_is_ignored() {
    let b = backend(0).await;
    let g = gateway(&file(&b, "memory", ROUTES)).await;
    let path = g.file.clone().unwrap();
    let c = Client::new();
    let send = || {
        c.post(url(&g, "/orders/quick"))
            .header("x-user-id", "u1")
            .header("content-type", "application/json")
            .body(r#"{"sku":"r1"}"#)
            .send()
    };
    let routes = || async {
        let h = health(&g).await;
        h["routes"].as_u64().unwrap()
    };
    assert_eq!(send().await.unwrap().status(), 201);
    assert_eq!(send().await.unwrap().status(), 409);
    // An invalid file: logged, the old routes stay.
    std::fs::write(
        &path,
        "upstream: http://127.0.0.1:1\nroutes:\n  - match: NOPE /x\n",
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(routes().await, 7);
    assert_eq!(send().await.unwrap().status(), 409, "still guarded");
    // A valid one without the fingerprint route, announced by SIGHUP.
    let fewer = file(
        &b,
        "memory",
        "  - match: POST /payments\n    guard: idempotency\n",
    );
    std::fs::write(&path, fewer).unwrap();
    g.signal("-HUP").await;
    let mut n = 0;
    for _ in 0..30 {
        n = routes().await;
        if n == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(n, 1);
    assert_eq!(
        send().await.unwrap().status(),
        201,
        "the route is gone: it passes through"
    );
    assert_eq!(effects(&b).await["/orders/quick"], 2);
}

/// Item 5 of issue 26: the health probe asks the store without writing
/// to it: no key is left behind (it used to `SET NX` one per probe). (It
/// was readiness's probe until issue 38 made readiness the process's.)
#[tokio::test]
async fn the_health_probe_writes_nothing_to_the_store() {
    let redis = RedisServer::start().await;
    let b = backend(0).await;
    let routes = "  - match: POST /payments\n    guard: idempotency\n";
    let g = gateway(&file(&b, &redis.url(), routes)).await;
    let c = Client::new();
    for _ in 0..3 {
        let res = c.get(url(&g, "/.norepeat/healthz")).send().await.unwrap();
        assert_eq!(res.status(), 200);
        let res = c.get(url(&g, "/.norepeat/readyz")).send().await.unwrap();
        assert_eq!(res.status(), 200);
    }
    let mut conn = redis.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    // A start writes the store's epoch (its TTL refreshed: a store that
    // lost its data is told from one that kept it) and nothing else, and
    // a probe writes nothing.
    assert!(
        keys.iter().all(|k| k == "norepeat:gateway:epoch"),
        "the probe wrote {keys:?}"
    );
    assert!(redis.keys_without_ttl().await.is_empty());
}

/// A file caught half-written is never applied: the first lines of the
/// file (no `routes` yet) are refused as a reload that would remove every
/// route without saying so, and counted as a failed reload; the routes
/// stay and keep guarding. An explicit `routes: []` is applied. Before, the
/// first lines passed `check` and were applied (`reloaded routes=0`): a
/// repeat ran twice while the file was being written.
#[tokio::test]
async fn a_file_cut_short_is_never_applied_and_reloads_are_counted() {
    let b = backend(0).await;
    let g = gateway(&file(&b, "memory", ROUTES)).await;
    let path = g.file.clone().unwrap();
    let c = Client::new();
    let send = || {
        c.post(url(&g, "/orders/quick"))
            .header("x-user-id", "u1")
            .header("content-type", "application/json")
            .body(r#"{"sku":"half"}"#)
            .send()
    };
    assert_eq!(send().await.unwrap().status(), 201);
    // The head of the file, as an editor or `cp` leaves it for a moment.
    std::fs::write(
        &path,
        format!(
            "upstream: http://127.0.0.1:{}\nstore: memory\nidentity:\n  header: X-User-Id\n",
            b.port
        ),
    )
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while value(
        &scrape(&g).await,
        "norepeat_gateway_reloads_total",
        "result=\"failed\"",
    ) < 1
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no failed reload counted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(health(&g).await["routes"], 7);
    assert_eq!(send().await.unwrap().status(), 409, "still guarded");
    assert_eq!(effects(&b).await["/orders/quick"], 1);
    // Said so: every route removed.
    std::fs::write(
        &path,
        format!(
            "upstream: http://127.0.0.1:{}\nstore: memory\nroutes: []\n",
            b.port
        ),
    )
    .unwrap();
    while value(
        &scrape(&g).await,
        "norepeat_gateway_reloads_total",
        "result=\"applied\"",
    ) < 1
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no applied reload counted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(health(&g).await["routes"], 0);
}

/// `SIGHUP` at once after `listening on` reloads, never kills: the handler
/// is in place before the gateway says it listens (before, one start in
/// five died of the signal's default action).
#[tokio::test]
async fn sighup_right_after_listening_does_not_kill_the_gateway() {
    let b = backend(0).await;
    for _ in 0..5 {
        let mut g = gateway(&file(&b, "memory", ROUTES)).await;
        g.signal("-HUP").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(g.process.is_running(), "SIGHUP killed the gateway");
        assert_eq!(health(&g).await["status"], "ok");
    }
}

/// Issue 38, item 3: the gateway starts while its Redis is down (before:
/// it exited, "store connection failed", and a rollout during a Redis
/// restart took every new instance down). Meanwhile each route follows its
/// failure policy (a fail-open token route passes, having no secret to
/// check a token against; the token endpoint answers 503), readiness stays
/// 200 and healthz says what refuses; once Redis answers, the store is
/// connected in the background and tokens are issued and checked.
#[tokio::test]
async fn the_gateway_starts_with_its_store_down_and_connects_when_it_answers() {
    let mut redis = RedisServer::start().await;
    redis.kill();
    let b = backend(0).await;
    let routes = "
  - match: POST /orders
    guard: token
  - match: POST /payments
    guard: idempotency
";
    let g = gateway(&file(&b, &redis.url(), routes)).await;
    let c = Client::new();
    let ready = c.get(url(&g, "/.norepeat/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    let h = health_once(&g, "store_answers", false.into()).await;
    assert_eq!(h["refusing"], serde_json::json!(["POST /payments"]), "{h}");
    let order = || {
        c.post(url(&g, "/orders"))
            .header("x-user-id", "u1")
            .body("{}")
            .send()
    };
    assert_eq!(
        order().await.unwrap().status(),
        201,
        "the token route fails open"
    );
    let fail_open = r#"route="POST /orders",outcome="fail_open""#;
    assert_eq!(
        value(
            &scrape(&g).await,
            "norepeat_gateway_requests_total",
            fail_open
        ),
        1,
        "counted as failed open, not passed"
    );
    let token = c
        .get(url(&g, "/.norepeat/token"))
        .header("x-user-id", "u1")
        .send()
        .await
        .unwrap();
    assert_eq!(
        code(token).await,
        (StatusCode::SERVICE_UNAVAILABLE, "guard_unavailable".into())
    );
    let pay = c
        .post(url(&g, "/payments"))
        .header("x-user-id", "u1")
        .header("idempotency-key", "k1")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(
        code(pay).await,
        (StatusCode::SERVICE_UNAVAILABLE, "guard_unavailable".into())
    );
    assert_eq!(
        effects(&b).await["/payments"],
        Value::Null,
        "refused, never run"
    );

    redis.restart().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let issued = loop {
        let res = c
            .get(url(&g, "/.norepeat/token"))
            .header("x-user-id", "u1")
            .send()
            .await
            .unwrap();
        if res.status() == StatusCode::OK {
            break res.json::<Value>().await.unwrap();
        }
        assert!(tokio::time::Instant::now() < deadline, "never connected");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let t = issued["repeatToken"].as_str().unwrap().to_owned();
    let with = |t: &str| {
        c.post(url(&g, "/orders"))
            .header("x-user-id", "u1")
            .header("repeat-token", t.to_owned())
            .body("{}")
            .send()
    };
    assert_eq!(with(&t).await.unwrap().status(), 201);
    assert_eq!(
        code(with(&t).await.unwrap()).await.1,
        "duplicate_submission"
    );
    assert_eq!(code(order().await.unwrap()).await.1, "missing_token");
    health_once(&g, "store_answers", true.into()).await;
}

/// Issue 38, item 3: `SIGTERM` turns readiness to 503 first while the
/// listener still accepts for `drain_delay` (a new connection is still
/// served), then stops accepting and exits 0. Before, the listener closed
/// at once and clients of an instance being replaced got "connection
/// refused" before the load balancer had noticed.
#[tokio::test]
async fn sigterm_drains_readiness_first_while_still_accepting() {
    let b = backend(0).await;
    // Long enough that a loaded machine still sends its requests inside it.
    let yaml = format!("drain_delay: 8s\n{}", file(&b, "memory", ROUTES));
    let mut g = gateway(&yaml).await;
    let fresh = || Client::builder().pool_max_idle_per_host(0).build().unwrap();
    assert_eq!(
        fresh()
            .get(url(&g, "/.norepeat/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // Sixteen probes, each on a fresh connection after the other, from
    // before the signal until each sees the drain: one of them is likely
    // in flight as the drain begins. Every 503 tells its HTTP/1 client to
    // leave its connection, as the traffic's answers do (issue 52, item
    // 9); one that read the drain only inside readiness once lacked it.
    let probes: Vec<_> = (0..16)
        .map(|_| {
            let ready = url(&g, "/.norepeat/readyz");
            tokio::spawn(async move {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
                loop {
                    let res = fresh().get(&ready).send().await.unwrap();
                    if res.status() != StatusCode::OK || tokio::time::Instant::now() > deadline {
                        break res;
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    g.signal("-TERM").await;
    let mut draining = Vec::new();
    for probe in probes {
        draining.push(probe.await.unwrap());
    }
    for res in &draining {
        assert_eq!(res.status(), 503);
        assert_eq!(
            res.headers().get("connection").map(|v| v.as_bytes()),
            Some(&b"close"[..]),
            "a draining answer tells its client to leave"
        );
    }
    let draining = draining.pop().unwrap();
    assert_eq!(
        draining.json::<Value>().await.unwrap()["status"],
        "draining"
    );
    let during = fresh()
        .post(url(&g, "/other"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(during.status(), 201, "a new connection still served");
    assert_eq!(during.headers()["connection"], "close");
    let exit = g
        .process
        .wait_exit(Duration::from_secs(25))
        .await
        .expect("exits");
    assert_eq!(exit.code(), Some(0));
    assert!(
        fresh()
            .get(url(&g, "/.norepeat/readyz"))
            .send()
            .await
            .is_err()
    );
}

/// Issue 38, item 4: `--help` names every environment variable the binary
/// reads, and `store: memory` warns at start that nothing survives a
/// restart or reaches a second instance; logs to a pipe carry no ANSI
/// colour codes.
#[tokio::test]
async fn help_names_the_environment_and_a_memory_store_warns() {
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_norepeat-gateway"))
        .arg("--help")
        .output()
        .unwrap();
    let text = String::from_utf8(help.stdout).unwrap();
    for var in [
        "NOREPEAT_GATEWAY_TOKEN_SECRET",
        "RUST_LOG",
        "NOREPEAT_LOG_FORMAT",
        "NO_COLOR",
        "token_env",
    ] {
        assert!(text.contains(var), "--help lacks {var}: {text}");
    }
    let b = backend(0).await;
    let path = config_file(&file(&b, "memory", ROUTES));
    let mut child = Command::new(env!("CARGO_BIN_EXE_norepeat-gateway"))
        .arg("--config")
        .arg(&path)
        .arg("--listen")
        .arg("127.0.0.1:0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let listening = out.next_line().await.unwrap().unwrap();
    assert!(listening.starts_with("listening on"), "{listening}");
    child.start_kill().unwrap();
    let mut err = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut child.stderr.take().unwrap(), &mut err)
        .await
        .unwrap();
    assert!(err.contains("do not survive a restart"), "{err}");
    assert!(
        !err.contains('\u{1b}'),
        "ANSI codes in a piped log: {err:?}"
    );
    let _ = std::fs::remove_file(path);
}

/// Issue 51, item 2: a Redis without persistence restarted empty lost
/// every record and the token secret. A gateway that ran through it
/// notices (healthz `store_lost_data_at`, the counter) and reads the
/// secret anew, so a gateway started after the loss (which made a new
/// secret) and it sign and check with one secret again: a token from one
/// is taken by the other (before, each refused the other's: 409 both
/// ways). With `on_data_loss.hold`, its idempotency routes answer 503
/// `records_lost` meanwhile: a retry of a payment made before would run.
#[tokio::test]
async fn a_store_that_lost_its_data_is_noticed_and_one_secret_is_shared_again() {
    let mut redis = RedisServer::start().await;
    let b = backend(0).await;
    // `on_data_loss.hold`: the idempotency routes wait after a loss.
    let yaml = format!(
        "on_data_loss: {{ hold: 1m }}\n{}",
        file(&b, &redis.url(), ROUTES)
    );
    let first = gateway(&yaml).await;
    assert_eq!(health(&first).await["store_lost_data_at"], Value::Null);
    // The kit's Redis keeps nothing on disk, and holds the file's
    // idempotency records: said in healthz and at start.
    health_once(&first, "store_persistent", false.into()).await;
    assert_eq!(pay_on(&first, "/payments", "k-before").await.status(), 201);
    redis.restart().await;
    // The Redis comes back with AOF on: a gateway started now says so.
    redis.config_set("appendonly", "yes").await;
    let second = gateway(&yaml).await;
    health_once(&second, "store_persistent", true.into()).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !health(&first).await["store_lost_data_at"].is_number() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the loss was not noticed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A retry of a payment made before the loss would run again: held.
    assert_eq!(
        code(pay_on(&first, "/payments", "k-before").await).await,
        (StatusCode::SERVICE_UNAVAILABLE, "records_lost".into())
    );
    let c = Client::new();
    let order = |g: &Process, token: String| {
        c.post(url(g, "/orders"))
            .header("x-user-id", "u1")
            .header("repeat-token", token)
            .body("{}")
            .send()
    };
    let from_second = token_for(&second, "u1").await["repeatToken"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(order(&first, from_second).await.unwrap().status(), 201);
    let from_first = token_for(&first, "u1").await["repeatToken"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(order(&second, from_first).await.unwrap().status(), 201);
    let text = scrape(&first).await;
    assert!(
        text.lines()
            .any(|l| l == "norepeat_gateway_store_data_lost_total 1"),
        "{text}"
    );
}
