// Over 400 lines: what an operator reads (metrics, logs, the admin), each through the binary, sharing its readers.
//! What an operator looks at: metrics by the contract's outcomes, logs,
//! the access log and request ids, the admin listener and its records.

use crate::common::*;

#[tokio::test]
async fn json_logs_carry_the_shadow_line_with_its_route_and_no_caller_id() {
    let b = backend(0).await;
    let path = config_file(&file(&b, "memory", ROUTES));
    let mut child = Command::new(env!("CARGO_BIN_EXE_norepeat-gateway"))
        .arg("--config")
        .arg(&path)
        .arg("--listen")
        .arg("127.0.0.1:0")
        // Its stderr is read here, so it is not the kit's ShopProcess (which
        // forwards it); the same cleared environment all the same.
        .env_clear()
        .envs(
            norepeat_testkit::KEPT_ENV
                .iter()
                .filter_map(|k| Some((*k, std::env::var_os(k)?))),
        )
        .env("NOREPEAT_LOG_FORMAT", "json")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = out.next_line().await.unwrap().unwrap();
    let port: u16 = first.rsplit(':').next().unwrap().parse().unwrap();
    let c = Client::new();
    for _ in 0..2 {
        let res = c
            .post(format!("http://127.0.0.1:{port}/coupons/c1/redeem"))
            .header("x-user-id", "u1")
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 201);
    }
    child.kill().await.unwrap();
    let _ = std::fs::remove_file(&path);
    let mut err = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut shadow = None;
    while let Some(line) = err.next_line().await.unwrap() {
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        if v["fields"]["message"] == "shadow mode: would refuse; let through" {
            shadow = Some(v);
        }
    }
    let shadow = shadow.expect("a shadow line");
    assert_eq!(shadow["fields"]["route"], "POST /coupons/{id}/redeem");
    assert_eq!(shadow["fields"]["would"], "duplicate");
    assert!(
        !shadow.to_string().contains("u1"),
        "the caller is hashed: {shadow}"
    );
}

/// Item 2 of issue 26: `norepeat_gateway_requests_total` counts each kind
/// of request by the contract's outcomes only, `fail_open` included (the
/// store killed under a fail-open route); malformed requests go to
/// `norepeat_gateway_invalid_total{code}`; shadow counts use only the
/// contract's `would`.
#[tokio::test]
async fn every_request_is_counted_by_the_contracts_outcomes() {
    let mut redis = RedisServer::start().await;
    let b = backend(0).await;
    let routes = format!(
        "{ROUTES}  - match: POST /dead
    guard: fingerprint
    upstream: http://127.0.0.1:{}
  - match: POST /slow-pay
    guard: idempotency
    timeout: 20s
",
        free_port()
    );
    let yaml =
        file(&b, &redis.url(), &routes).replace("X-User-Id\n", "X-User-Id\n  required: true\n");
    let g = gateway(&yaml).await;
    let c = Client::new();
    let req = |path: &str| c.post(url(&g, path)).header("x-user-id", "u1");
    let requests = |route: &str, outcome: &str| {
        let labels = format!(r#"route="{route}",outcome="{outcome}""#);
        let g = &g;
        async move { value(&scrape(g).await, "norepeat_gateway_requests_total", &labels) }
    };
    let quick = r#"{"sku":"m1"}"#;
    let fp = || {
        req("/orders/quick")
            .header("content-type", "application/json")
            .body(quick)
            .send()
    };

    assert_eq!(fp().await.unwrap().status(), 201);
    assert_eq!(requests("POST /orders/quick", "passed").await, 1);
    assert_eq!(fp().await.unwrap().status(), 409);
    assert_eq!(requests("POST /orders/quick", "duplicate").await, 1);
    let anonymous = c
        .post(url(&g, "/orders/quick"))
        .body(quick)
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    assert_eq!(requests("POST /orders/quick", "unauthenticated").await, 1);

    let pay = |key: &'static str, body: &'static str| {
        req("/payments")
            .header("idempotency-key", key)
            .body(body)
            .send()
    };
    assert_eq!(pay("m-k1", "{}").await.unwrap().status(), 201);
    assert_eq!(requests("POST /payments", "passed").await, 1);
    assert_eq!(pay("m-k1", "{}").await.unwrap().status(), 201);
    assert_eq!(requests("POST /payments", "replayed").await, 1);
    assert_eq!(pay("m-k1", r#"{"a":1}"#).await.unwrap().status(), 422);
    assert_eq!(requests("POST /payments", "mismatch").await, 1);

    // In progress: a second request while the first (held at the backend)
    // still runs.
    let slow = tokio::spawn(
        req("/slow-pay")
            .header("idempotency-key", "m-slow")
            .header("x-delay", "3")
            .body("{}")
            .send(),
    );
    arrived(&b, "/slow-pay").await;
    let busy = req("/slow-pay")
        .header("idempotency-key", "m-slow")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(code(busy).await.1, "idempotency_key_in_use");
    assert_eq!(requests("POST /slow-pay", "in_progress").await, 1);
    assert_eq!(slow.await.unwrap().unwrap().status(), 201);

    // The upstream's failures and the unknown outcome.
    let late = || {
        req("/payments")
            .header("idempotency-key", "m-late")
            .header("x-delay", "1.5")
            .body("{}")
            .send()
    };
    assert_eq!(late().await.unwrap().status(), 504);
    assert_eq!(requests("POST /payments", "upstream_timeout").await, 1);
    assert_eq!(late().await.unwrap().status(), 409);
    assert_eq!(requests("POST /payments", "outcome_unknown").await, 1);
    assert_eq!(req("/dead").body("{}").send().await.unwrap().status(), 502);
    assert_eq!(requests("POST /dead", "upstream_unavailable").await, 1);

    for _ in 0..3 {
        req("/flash-sale/m").send().await.unwrap();
    }
    assert_eq!(requests("POST /flash-sale/{sku}", "rate_limited").await, 1);
    assert_eq!(requests("POST /flash-sale/{sku}", "passed").await, 2);

    // Malformed for the guard: counted apart, by code.
    let bare = req("/payments").body("{}").send().await.unwrap();
    assert_eq!(code(bare).await.1, "missing_idempotency_key");
    let no_token = req("/orders").send().await.unwrap();
    assert_eq!(code(no_token).await.1, "missing_token");
    let text = scrape(&g).await;
    assert_eq!(
        value(
            &text,
            "norepeat_gateway_invalid_total",
            r#"route="POST /payments",code="missing_idempotency_key""#
        ),
        1,
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            "norepeat_gateway_invalid_total",
            r#"route="POST /orders",code="missing_token""#
        ),
        1
    );
    assert_eq!(
        requests("POST /orders", "duplicate").await,
        0,
        "a missing token is no duplicate"
    );

    // Shadow: every request passed, the would-refusals counted apart.
    for _ in 0..2 {
        let res = req("/coupons/c1/redeem").body("{}").send().await.unwrap();
        assert_eq!(res.status(), 201);
    }
    assert_eq!(requests("POST /coupons/{id}/redeem", "passed").await, 2);

    // The store gone: the fail-open route lets requests through (and says
    // so), the fail-closed one refuses.
    redis.kill();
    let open = req("/orders/quick")
        .body(r#"{"sku":"m2"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(open.status(), 201);
    assert_eq!(requests("POST /orders/quick", "fail_open").await, 1);
    assert_eq!(
        requests("POST /orders/quick", "passed").await,
        1,
        "not counted as passed"
    );
    assert_eq!(pay("m-k9", "{}").await.unwrap().status(), 503);
    assert_eq!(requests("POST /payments", "unavailable").await, 1);

    let text = scrape(&g).await;
    let allowed = [
        "passed",
        "replayed",
        "duplicate",
        "in_progress",
        "mismatch",
        "rate_limited",
        "unauthenticated",
        "fail_open",
        "unavailable",
        "upstream_unavailable",
        "upstream_timeout",
        "outcome_unknown",
    ];
    let outcomes = label_values(&text, "norepeat_gateway_requests_total", "outcome");
    assert!(outcomes.len() >= allowed.len(), "{text}");
    for o in &outcomes {
        assert!(
            allowed.contains(&o.as_str()),
            "outcome {o:?} is not the contract's: {text}"
        );
    }
    let would = label_values(&text, "norepeat_gateway_shadow_total", "would");
    assert_eq!(would, ["duplicate"], "{text}");
    assert_eq!(
        value(
            &text,
            "norepeat_gateway_shadow_total",
            r#"route="POST /coupons/{id}/redeem",would="duplicate""#
        ),
        1
    );
}

/// Item 1 and 2 in shadow mode: a shadowed idempotency route's would-be
/// replay is `would="replay"`, and a request without a key (which it would
/// refuse 400) is counted as invalid, never as a `would` of its own.
#[tokio::test]
async fn a_shadow_routes_counts_use_the_contracts_would_only() {
    let b = backend(0).await;
    let routes = "  - match: POST /payments
    guard: idempotency
    shadow: true
";
    let g = gateway(&file(&b, "memory", routes)).await;
    let c = Client::new();
    for key in [Some("s-1"), Some("s-1"), None] {
        let mut r = c
            .post(url(&g, "/payments"))
            .header("x-user-id", "u1")
            .body("{}");
        if let Some(k) = key {
            r = r.header("idempotency-key", k);
        }
        assert_eq!(r.send().await.unwrap().status(), 201);
    }
    assert_eq!(effects(&b).await["/payments"], 3);
    let text = scrape(&g).await;
    assert_eq!(
        label_values(&text, "norepeat_gateway_shadow_total", "would"),
        ["replay"],
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            "norepeat_gateway_invalid_total",
            r#"route="POST /payments",code="missing_idempotency_key""#
        ),
        1,
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            "norepeat_gateway_requests_total",
            r#"route="POST /payments",outcome="passed""#
        ),
        3
    );
}

/// Issue 38, item 4: the access log (one JSON line per request, to a file
/// here), `X-Request-Id` forwarded when a trusted proxy sent one and made
/// when it did not or the client is not one (the backend and the client
/// both see it), and the admin
/// listener serving health, readiness and metrics apart from the traffic.
#[tokio::test]
async fn an_access_log_line_per_request_with_its_request_id_and_an_admin_listener() {
    let b = backend(0).await;
    let log = AccessLog::new();
    let admin = free_port();
    // The test client is a trusted proxy here: its X-Request-Id is kept.
    let trusting = file(&b, "memory", ROUTES).replace(
        "identity:\n  header: X-User-Id\n",
        "identity:\n  header: X-User-Id\n  trusted_proxies: [127.0.0.1/32]\n",
    );
    let yaml = format!(
        "access_log: {}\nadmin: {{ listen: 127.0.0.1:{admin} }}\n{trusting}",
        log.display(),
    );
    let g = gateway(&yaml).await;
    let c = Client::new();
    // From a client outside trusted_proxies, its own id is replaced.
    let untrusting = gateway(&file(&b, "memory", ROUTES)).await;
    let replaced = c
        .get(url(&untrusting, "/echo"))
        .header("x-request-id", "req-8")
        .send()
        .await
        .unwrap();
    let made = replaced.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(made.len(), 32, "{made}");
    assert_eq!(
        replaced.json::<Value>().await.unwrap()["x-request-id"],
        made.as_str()
    );
    let echo = c
        .get(url(&g, "/echo"))
        .header("x-request-id", "req-7")
        .send()
        .await
        .unwrap();
    assert_eq!(echo.headers()["x-request-id"], "req-7");
    let seen: Value = echo.json().await.unwrap();
    assert_eq!(seen["x-request-id"], "req-7", "forwarded as sent");
    let made = c.get(url(&g, "/echo")).send().await.unwrap();
    let id = made.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert_eq!(id.len(), 32);
    let seen: Value = made.json().await.unwrap();
    assert_eq!(
        seen["x-request-id"],
        id.as_str(),
        "the backend gets the one made"
    );
    let pay = || {
        c.post(url(&g, "/payments"))
            .header("x-user-id", "u1")
            .header("idempotency-key", "k-log")
            .body("{}")
            .send()
    };
    assert_eq!(pay().await.unwrap().status(), 201);
    assert_eq!(pay().await.unwrap().status(), 201);

    // Written by the log's own thread: waited for.
    let written = log_lines(&log, "\"request_id\"", 4).await;
    let text = written.join("\n");
    let lines: Vec<Value> = written
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4, "{text}");
    // Issue 54: the fields a team greps for.
    assert_eq!(lines[2]["client"], "127.0.0.1", "{text}");
    assert!(
        lines[2]["host"]
            .as_str()
            .is_some_and(|h| h.starts_with("127.0.0.1:")),
        "{text}"
    );
    assert_eq!(lines[2]["upstream_status"], 201, "{text}");
    assert_eq!(lines[2]["bytes_in"], 2, "{text}");
    assert_eq!(lines[3]["upstream_status"], Value::Null, "a replay: {text}");
    assert_eq!(lines[0]["request_id"], "req-7");
    assert_eq!(lines[0]["outcome"], "passthrough");
    assert_eq!(lines[0]["route"], Value::Null);
    assert_eq!(lines[0]["path"], "/echo");
    assert_eq!(lines[0]["status"], 200);
    assert!(lines[0]["upstream_ms"].is_number(), "{}", lines[0]);
    assert_eq!(lines[1]["request_id"], id.as_str());
    assert_eq!(lines[2]["route"], "POST /payments");
    assert_eq!(lines[2]["outcome"], "passed");
    assert_eq!(lines[2]["method"], "POST");
    assert!(lines[2]["upstream_ms"].is_number());
    assert_eq!(lines[3]["outcome"], "replayed");
    assert_eq!(
        lines[3]["upstream_ms"],
        Value::Null,
        "a replay reaches no backend"
    );
    for l in &lines {
        assert!(l["time"].as_str().unwrap().ends_with('Z'), "{l}");
    }

    let on_admin = |path: &str| format!("http://127.0.0.1:{admin}{path}");
    let h: Value = c
        .get(on_admin("/.norepeat/healthz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(h["status"], "ok");
    assert_eq!(
        c.get(on_admin("/.norepeat/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let m = c
        .get(on_admin("/.norepeat/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(m.contains("norepeat_gateway_requests_total"), "{m}");
    // Issue 54: the answers per route by status class.
    assert!(
        m.contains(r#"norepeat_gateway_responses_total{route="POST /payments",class="2xx"} 2"#),
        "{m}"
    );
    let traffic = c.get(on_admin("/echo")).send().await.unwrap();
    assert_eq!(traffic.status(), 404, "no traffic on the admin listener");
    // Issue 54: with an admin listener, health, readiness and metrics are
    // served there only; the token route stays public.
    for own in ["healthz", "readyz", "metrics"] {
        let public = c
            .get(url(&g, &format!("/.norepeat/{own}")))
            .send()
            .await
            .unwrap();
        assert_eq!(public.status(), 404, "{own} on the public listener");
    }
    let token = c
        .get(url(&g, "/.norepeat/token"))
        .header("x-user-id", "u1")
        .send()
        .await
        .unwrap();
    assert_eq!(token.status(), 200);
}

/// Issue 54: `admin.public` keeps some own routes on the traffic's
/// listener (a load balancer's health check on the public port).
#[tokio::test]
async fn admin_public_keeps_the_listed_own_routes_on_the_traffic_port() {
    let b = backend(0).await;
    let admin = free_port();
    let yaml = format!(
        "admin: {{ listen: 127.0.0.1:{admin}, public: [healthz] }}\n{}",
        file(&b, "memory", ROUTES)
    );
    let g = gateway(&yaml).await;
    let c = Client::new();
    let status = |p: &'static str| {
        let c = c.clone();
        let u = url(&g, p);
        async move { c.get(u).send().await.unwrap().status() }
    };
    assert_eq!(status("/.norepeat/healthz").await, 200);
    assert_eq!(status("/.norepeat/metrics").await, 404);
    assert_eq!(status("/.norepeat/readyz").await, 404);
}

/// Issue 54: `SIGUSR1` (logrotate's usual signal) opens the access log
/// again: after the file is moved away, the next lines go to a new file
/// at its path. Before, the signal ended the process without a line.
#[tokio::test]
async fn sigusr1_reopens_the_access_log_for_logrotate() {
    let b = backend(0).await;
    let log = AccessLog::new();
    let yaml = format!(
        "access_log: {}\n{}",
        log.display(),
        file(&b, "memory", ROUTES)
    );
    let g = gateway(&yaml).await;
    let c = Client::new();
    c.get(url(&g, "/before")).send().await.unwrap();
    log_line(&log, "/before").await;
    let rotated = log.with_extension("log.1");
    std::fs::rename(&*log, &rotated).unwrap();
    g.signal("-USR1").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !log.exists() {
        assert!(tokio::time::Instant::now() < deadline, "no new file");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.get(url(&g, "/after")).send().await.unwrap();
    log_line(&log, "/after").await;
    let old = std::fs::read_to_string(&rotated).unwrap();
    assert!(old.contains("/before") && !old.contains("/after"), "{old}");
    g.signal("-USR2").await;
    let still = c.get(url(&g, "/still")).send().await.unwrap();
    assert_eq!(still.status(), 404, "the backend still answers through it");
}

/// Issue 38, item 4: with an admin token, an operator reads one key's
/// record on the admin listener and clears it once the backend's side is
/// checked: here a payment whose backend timed out (an unknown outcome,
/// 409 to every retry) is read as `outcome_unknown`, cleared, and its
/// retry then runs. Without the token, or with another, nothing is shown.
#[tokio::test]
async fn an_operator_reads_and_clears_one_keys_record_with_the_admin_token() {
    let b = backend(0).await;
    let admin = free_port();
    let token = "an-admin-token-of-some-length";
    let yaml = format!(
        "admin: {{ listen: 127.0.0.1:{admin}, token_env: NOREPEAT_GATEWAY_ADMIN_TOKEN }}\n{}{}",
        file(&b, "memory", ROUTES),
        "  - match: POST /slowpay\n    guard: idempotency\n    timeout: 30s\n"
    );
    let conf = config_file(&yaml);
    let process = ShopProcess::spawn(
        env!("CARGO_BIN_EXE_norepeat-gateway"),
        [
            "--config",
            &conf.to_string_lossy(),
            "--listen",
            "127.0.0.1:0",
        ]
        .map(String::from)
        .into(),
        vec![("NOREPEAT_GATEWAY_ADMIN_TOKEN".into(), token.into())],
    )
    .await;
    let port = process
        .base_url()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let g = Process {
        process,
        port,
        file: Some(conf),
    };
    let c = Client::new();
    let pay = |delay: &'static str| {
        c.post(url(&g, "/payments"))
            .header("x-user-id", "u1")
            .header("idempotency-key", "k-op")
            .header("x-delay", delay)
            .body("{}")
            .send()
    };
    assert_eq!(code(pay("1.5").await.unwrap()).await.1, "upstream_timeout");
    assert_eq!(
        code(pay("0").await.unwrap()).await.1,
        "idempotency_outcome_unknown"
    );

    let record = format!(
        "http://127.0.0.1:{admin}/.norepeat/admin/record?method=POST&path=/payments&key=k-op&host=127.0.0.1"
    );
    let ask = |m: reqwest::Method, t: &str| {
        c.request(m, &record)
            .header("norepeat-admin-token", t.to_owned())
            .header("x-user-id", "u1")
            .send()
    };
    assert_eq!(
        ask(reqwest::Method::GET, "wrong").await.unwrap().status(),
        401
    );
    let read: Value = ask(reqwest::Method::GET, token)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(read["state"], "outcome_unknown", "{read}");
    // The status the client was told (issue 51: it showed the 200 kept).
    assert_eq!(read["status"], 504, "{read}");
    let other = c
        .get(&record)
        .header("norepeat-admin-token", token)
        .header("x-user-id", "u2")
        .send()
        .await
        .unwrap();
    assert_eq!(
        other.status(),
        404,
        "another caller has no record under k-op"
    );
    // The operator checked the backend: the charge did not happen.
    let cleared = ask(reqwest::Method::DELETE, token).await.unwrap();
    assert_eq!(cleared.status(), 200);
    assert_eq!(cleared.json::<Value>().await.unwrap()["cleared"], true);
    assert_eq!(
        ask(reqwest::Method::GET, token).await.unwrap().status(),
        404
    );
    assert_eq!(
        pay("0").await.unwrap().status(),
        201,
        "the cleared key runs"
    );
    assert_eq!(effects(&b).await["/payments"], 2);

    // A record whose request still runs is not cleared: a retry would run
    // the payment beside it.
    let slow = tokio::spawn(
        c.post(url(&g, "/slowpay"))
            .header("x-user-id", "u1")
            .header("idempotency-key", "k-slow")
            .header("x-delay", "3")
            .body("{}")
            .send(),
    );
    arrived(&b, "/slowpay").await;
    let running = format!(
        "http://127.0.0.1:{admin}/.norepeat/admin/record?method=POST&path=/slowpay&key=k-slow&host=127.0.0.1"
    );
    let read: Value = c
        .get(&running)
        .header("norepeat-admin-token", token)
        .header("x-user-id", "u1")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(read["state"], "in_progress", "{read}");
    let refused = c
        .delete(&running)
        .header("norepeat-admin-token", token)
        .header("x-user-id", "u1")
        .send()
        .await
        .unwrap();
    assert_eq!(
        code(refused).await,
        (StatusCode::CONFLICT, "record_in_progress".into())
    );
    assert_eq!(slow.await.unwrap().unwrap().status(), 201);
    assert_eq!(effects(&b).await["/slowpay"], 1);
}

/// A client that leaves before its answer still gets its access-log line:
/// status 499, outcome `client_closed`, its request id and path, as NGINX
/// logs it (before: the line was written after the answer, so a request
/// whose client left was never logged).
#[tokio::test]
async fn a_client_that_leaves_before_its_answer_is_logged_499_client_closed() {
    let b = backend(0).await;
    let log = AccessLog::new();
    let yaml = format!(
        "access_log: {}\n{}",
        log.display(),
        file(&b, "memory", ROUTES)
    );
    let g = gateway(&yaml).await;
    let gave_up = tokio::time::timeout(
        Duration::from_millis(300),
        Client::new()
            .post(url(&g, "/slow-report"))
            .header("x-delay", "3")
            .body("{}")
            .send(),
    )
    .await;
    assert!(gave_up.is_err(), "the client gave up before the answer");
    let line = log_line(&log, "/slow-report").await;
    let entry: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(entry["status"], 499, "{line}");
    assert_eq!(entry["outcome"], "client_closed", "{line}");
    assert_eq!(entry["method"], "POST", "{line}");
    assert_eq!(
        entry["request_id"].as_str().map(str::len),
        Some(32),
        "{line}"
    );
}

/// Issue 51, item 7: the admin reaches every record. A caller identified
/// by its address is named with `client=ADDRESS` (it was a 400: the admin
/// request's own address is not the client's); a backend's own 500 under
/// `keep` shows as the 500 the client got; a completed record, whose
/// answer retries get, is not cleared (409 `record_completed`) unless
/// `force=true`.
#[tokio::test]
async fn the_admin_reaches_records_of_an_address_and_keeps_completed_ones() {
    let b = backend(0).await;
    let admin = free_port();
    let token = "an-admin-token-of-some-length";
    let yaml = format!(
        "upstream: http://127.0.0.1:{}\nadmin: {{ listen: 127.0.0.1:{admin}, token_env: T }}\nroutes:\n  - match: POST /payments\n    guard: idempotency\n",
        b.port
    );
    let g = gateway_env(&yaml, &[("T", token)]).await;
    let c = Client::new();
    let pay = |key: &'static str, status: &'static str| {
        c.post(url(&g, "/payments"))
            .header("idempotency-key", key)
            .header("x-status", status)
            .body("{}")
            .send()
    };
    assert_eq!(pay("k-500", "500").await.unwrap().status(), 500);
    assert_eq!(pay("k-done", "201").await.unwrap().status(), 201);
    let record = |key: &str, extra: &str| {
        format!(
            "http://127.0.0.1:{admin}/.norepeat/admin/record?method=POST&path=/payments&key={key}&host=127.0.0.1{extra}"
        )
    };
    let ask = |m: reqwest::Method, u: String| {
        c.request(m, u).header("norepeat-admin-token", token).send()
    };
    let unnamed = ask(reqwest::Method::GET, record("k-500", ""))
        .await
        .unwrap();
    assert_eq!(unnamed.status(), 400, "no caller without client=");
    let read: Value = ask(reqwest::Method::GET, record("k-500", "&client=127.0.0.1"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (read["state"].as_str(), read["status"].as_u64()),
        (Some("outcome_unknown"), Some(500)),
        "{read}"
    );
    let done = record("k-done", "&client=127.0.0.1");
    let read: Value = ask(reqwest::Method::GET, done.clone())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(read["state"], "completed", "{read}");
    let refused = ask(reqwest::Method::DELETE, done.clone()).await.unwrap();
    assert_eq!(
        code(refused).await,
        (StatusCode::CONFLICT, "record_completed".into())
    );
    let forced = ask(reqwest::Method::DELETE, format!("{done}&force=true"))
        .await
        .unwrap();
    assert_eq!(forced.status(), 200);
    assert_eq!(effects(&b).await["/payments"], 2);
}
