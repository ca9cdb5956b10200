// Over 400 lines: each way around the guard a probe found, one test each, sharing the processes and the raw client.
//! Issue 52: the ways around the guard an attacker's probe found, and the
//! ways to hold the gateway, each through the real binary in front of
//! `tests/backend.py`: an `Upgrade: h2c` and a backend's 101, a client's
//! `Connection` naming the gateway's headers, other Hosts, a trickled
//! body, idle admin connections, a flood of public health probes.

use crate::common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The status of an HTTP/1.1 answer's text.
fn status(text: &str) -> u16 {
    text.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text:?}"))
}

/// Item 1, critical: `Upgrade: h2c` was forwarded, the backend's 101
/// joined the two connections, and the client spoke HTTP/2 to the backend
/// past every guard. Now an upgrade not in `upgrades` (h2c never is) goes
/// on without its `Upgrade` (the backend answers 426 here, having seen
/// none), and a 101 nobody asked for is a 502, through the lane and
/// through hyper's path alike; WebSocket still switches.
#[tokio::test]
async fn h2c_is_never_forwarded_and_a_101_nobody_asked_for_is_a_502() {
    let b = backend(0).await;
    let g = gateway(&file(&b, "memory", ROUTES)).await;
    let h2c = over_tcp(
        &g,
        b"GET /upgrade HTTP/1.1\r\nhost: a\r\nconnection: close, Upgrade, HTTP2-Settings\r\nupgrade: h2c\r\nhttp2-settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
    )
    .await;
    assert_eq!(status(&h2c), 426, "the backend saw no Upgrade: {h2c}");
    let unlisted = over_tcp(
        &g,
        b"GET /upgrade HTTP/1.1\r\nhost: a\r\nconnection: close, upgrade\r\nupgrade: echo\r\n\r\n",
    )
    .await;
    assert_eq!(status(&unlisted), 426, "{unlisted}");
    // A list: only what `upgrades` allows is asked of the backend (which
    // switches to the protocol it was asked).
    let (_s, mixed) = head_of(
        &g,
        b"GET /upgrade HTTP/1.1\r\nhost: a\r\nconnection: upgrade\r\nupgrade: h2c, websocket\r\n\r\n",
    )
    .await;
    assert!(mixed.starts_with("HTTP/1.1 101"), "{mixed}");
    assert!(!mixed.to_ascii_lowercase().contains("h2c"), "{mixed}");
    let (mut s, head) = head_of(
        &g,
        b"GET /upgrade HTTP/1.1\r\nhost: a\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    s.write_all(b"ping").await.unwrap();
    let mut echoed = [0u8; 4];
    s.read_exact(&mut echoed).await.unwrap();
    assert_eq!(&echoed, b"ping");

    // The backend switches on its own (a plain GET through the lane, and
    // one with a header that sends it through hyper's path).
    let lane = over_tcp(
        &g,
        b"GET /switch HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status(&lane), 502, "{lane}");
    assert!(lane.contains("upstream_switched_protocols"), "{lane}");
    let hyper = over_tcp(
        &g,
        b"GET /switch HTTP/1.1\r\nhost: a\r\nconnection: close, x-hop\r\nx-hop: 1\r\n\r\n",
    )
    .await;
    assert_eq!(status(&hyper), 502, "{hyper}");
    // h2c on a guarded route: the guard still decides (no key: 400).
    let guarded = over_tcp(
        &g,
        b"POST /payments HTTP/1.1\r\nhost: a\r\nx-user-id: u1\r\nconnection: close, upgrade\r\nupgrade: h2c\r\ncontent-length: 2\r\n\r\n{}",
    )
    .await;
    assert_eq!(status(&guarded), 400, "{guarded}");
    assert!(guarded.contains("missing_idempotency_key"), "{guarded}");
    assert_eq!(effects(&b).await.get("/payments"), None);
}

/// Writes `bytes` on a new connection and reads one answer's head.
async fn head_of(g: &Process, bytes: &[u8]) -> (tokio::net::TcpStream, String) {
    let mut s = connect(g).await;
    s.write_all(bytes).await.unwrap();
    let head = tokio::time::timeout(Duration::from_secs(10), read_head_bytes(&mut s))
        .await
        .expect("a head within 10 s")
        .expect("a head");
    (s, String::from_utf8_lossy(&head).into_owned())
}

/// Item 5: a client's `Connection` named the gateway's own headers, which
/// were then stripped on the way out: the take-over reached the backend
/// without its `Idempotency-Attempt`. What a client's `Connection` names
/// goes before the gateway adds its own.
#[tokio::test]
async fn a_clients_connection_header_never_removes_the_gateways_headers() {
    let b = backend(0).await;
    let g = gateway(&file(&b, "memory", ROUTES)).await;
    let (st, text) = raw(
        &g,
        "POST /payments",
        &[
            ("x-user-id", "u1"),
            ("idempotency-key", "k-connection"),
            (
                "connection",
                "Idempotency-Attempt, X-Request-Id, X-Forwarded-For",
            ),
        ],
        "{}",
    )
    .await;
    assert_eq!(st, 201, "{text}");
    assert_eq!(attempts(&b, "/payments").await, [serde_json::json!("1")]);
    let (st, text) = raw(
        &g,
        "GET /echo",
        &[
            ("connection", "x-request-id, x-forwarded-for, x-client-hop"),
            ("x-client-hop", "1"),
        ],
        "",
    )
    .await;
    assert_eq!(st, 200, "{text}");
    let body = &text[text.find("\r\n\r\n").unwrap() + 4..];
    let seen: Value = serde_json::from_str(body).unwrap();
    assert!(seen.get("x-request-id").is_some(), "{seen}");
    assert_eq!(seen["x-forwarded-for"], "127.0.0.1", "{seen}");
    assert!(
        seen.get("x-client-hop").is_none(),
        "a header it names goes: {seen}"
    );
}

/// Sends `head_line` with `host` as its Host on a new connection.
async fn with_host(g: &Process, head_line: &str, host: &str, extra: &str) -> String {
    let bytes = format!(
        "{head_line} HTTP/1.1\r\nhost: {host}\r\nx-user-id: u1\r\n{extra}connection: close\r\ncontent-length: 2\r\n\r\n{{}}"
    );
    over_tcp(g, bytes.as_bytes()).await
}

/// Item 4: another Host walked past a host-scoped guard, and an honest
/// retry under an alias ran again. With `hosts`, any other Host (an
/// address, another name, `pay.example..`, an absolute-form target naming
/// another site) is 421 `misdirected_request`, userinfo is refused, and
/// keys are the site's under each of its names.
#[tokio::test]
async fn only_the_sites_hosts_are_served_and_its_keys_are_one_across_its_names() {
    let b = backend(0).await;
    let yaml = format!(
        "hosts: [pay.example, www.pay.example]\n{}",
        file(&b, "memory", ROUTES)
    );
    let g = gateway(&yaml).await;
    for (line, host) in [
        ("POST /payments", "127.0.0.1"),
        ("POST /payments", "evil.example"),
        ("GET /plain", "evil.example"),
        ("POST http://evil.example/payments", "pay.example"),
    ] {
        let text = with_host(&g, line, host, "").await;
        assert_eq!(status(&text), 421, "{line} {host}: {text}");
        assert!(text.contains("misdirected_request"), "{text}");
    }
    for host in ["x@pay.example", "pay.example.."] {
        let text = with_host(&g, "POST /payments", host, "").await;
        assert_eq!(status(&text), 400, "{host}: {text}");
    }
    assert_eq!(effects(&b).await.get("/payments"), None, "nothing ran");
    // One key, the site's two names and two spellings: one payment.
    let first = with_host(
        &g,
        "POST /payments",
        "pay.example",
        "idempotency-key: k-alias\r\n",
    )
    .await;
    assert_eq!(status(&first), 201, "{first}");
    for host in ["www.pay.example", "PAY.EXAMPLE.:8443"] {
        let again = with_host(&g, "POST /payments", host, "idempotency-key: k-alias\r\n").await;
        assert_eq!(status(&again), 201, "{again}");
        assert!(
            again
                .to_ascii_lowercase()
                .contains("idempotent-replayed: true"),
            "{host}: {again}"
        );
    }
    assert_eq!(effects(&b).await["/payments"], 1);
}

/// Item 2: `body_timeout` bounds each pause, so a body trickled a byte
/// every half second was never cut. `request_timeout` bounds the whole
/// request: the trickle is answered 400 and its connection closed within
/// it, on an unguarded path and on a guarded one.
#[tokio::test]
async fn a_trickled_body_is_cut_at_request_timeout() {
    let b = backend(0).await;
    let yaml = format!(
        "limits: {{ header_timeout: 1s, body_timeout: 2s, request_timeout: 3s }}\n{}",
        file(&b, "memory", ROUTES)
    );
    let g = gateway(&yaml).await;
    for path in ["/upload", "/orders/quick"] {
        let mut s = connect(&g).await;
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: a\r\nx-user-id: u1\r\ncontent-length: 1000\r\n\r\n"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        let started = std::time::Instant::now();
        let (mut rd, mut wr) = s.into_split();
        let trickle = tokio::spawn(async move {
            for _ in 0..60 {
                if wr.write_all(b"x").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(20), rd.read_to_end(&mut out)).await;
        trickle.abort();
        assert!(read.is_ok(), "{path}: still held after 20 s");
        let took = started.elapsed();
        assert!(took < Duration::from_secs(15), "{path}: held {took:?}");
        let text = String::from_utf8_lossy(&out);
        assert!(text.is_empty() || status(&text) == 400, "{path}: {text}");
    }
    assert_eq!(effects(&b).await.get("/orders/quick"), None);
}

/// Item 3: the admin listener had no limits: idle connections to it used
/// up the process's descriptors and the traffic port could not accept.
/// Now it holds the traffic's timeouts and a small cap of its own: 300
/// idle admin connections against a limit of 256 descriptors leave the
/// traffic port serving, and an idle admin connection is closed at
/// `header_timeout`.
#[tokio::test]
async fn idle_admin_connections_cannot_starve_the_traffic_port() {
    let b = backend(0).await;
    let admin = free_port();
    let yaml = format!(
        "admin: {{ listen: 127.0.0.1:{admin} }}\nlimits: {{ header_timeout: 20s }}\n{}",
        file(
            &b,
            "memory",
            "  - match: POST /orders/quick\n    guard: fingerprint\n"
        )
    );
    let config = config_file(&yaml);
    let g = Process::start(
        "prlimit",
        vec![
            "--nofile=256:256".into(),
            "--".into(),
            env!("CARGO_BIN_EXE_norepeat-gateway").into(),
            "--config".into(),
            config.to_string_lossy().into_owned(),
            "--listen".into(),
            "127.0.0.1:0".into(),
        ],
    )
    .await;
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(
            tokio::net::TcpStream::connect(("127.0.0.1", admin))
                .await
                .unwrap(),
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let served = tokio::time::timeout(
        Duration::from_secs(5),
        Client::new().get(url(&g, "/plain")).send(),
    )
    .await;
    let served = served.expect("the traffic port answers within 5 s");
    assert_eq!(served.unwrap().status(), 404, "the backend's answer");
    drop(idle);
    let _ = std::fs::remove_file(config);

    // The traffic's header_timeout holds on the admin listener too.
    let admin = free_port();
    let yaml = format!(
        "admin: {{ listen: 127.0.0.1:{admin} }}\nlimits: {{ header_timeout: 1s }}\n{}",
        file(
            &b,
            "memory",
            "  - match: POST /orders/quick\n    guard: fingerprint\n"
        )
    );
    let _g = gateway(&yaml).await;
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", admin))
        .await
        .unwrap();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "an idle admin connection is closed");
}

/// Item 8: each public healthz sent two store commands, and a flood of
/// them opened the store's breaker. Health now reads what the process
/// keeps (a probe a second); the public one shows no reload error text.
#[tokio::test]
async fn a_flood_of_health_probes_costs_the_store_nothing() {
    let redis = RedisServer::start().await;
    let b = backend(0).await;
    let g = gateway(&file(&b, &redis.url(), ROUTES)).await;
    health_once(&g, "store_answers", true.into()).await;
    let mut conn = redis.connection().await;
    let processed = |info: String| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix("total_commands_processed:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap()
    };
    let before: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut conn)
        .await
        .unwrap();
    let c = Client::new();
    for _ in 0..200 {
        let h = c.get(url(&g, "/.norepeat/healthz")).send().await.unwrap();
        assert_eq!(h.status(), 200);
    }
    let after: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut conn)
        .await
        .unwrap();
    let spent = processed(after) - processed(before);
    // Two INFOs and a probe or a few a second while the loop ran.
    assert!(spent < 40, "{spent} commands for 200 health probes");
}

/// Item 9: a `SIGHUP` in the first moments after start (a reload asked by
/// a config manager as the process comes up) ended it: the handler was
/// installed only once the store had been reached. Here the store is a
/// socket that never answers, so starting takes its timeouts; a `SIGHUP`
/// meanwhile (as the store's first connection comes in, and 100 ms
/// later) must be no kill. Before, the signal went a fixed 30 ms after
/// the spawn: on a loaded machine that can be before the process reached
/// `main`, a window no program can close (one CI run at four tests a
/// time lost it so).
#[tokio::test]
async fn a_sighup_while_starting_is_no_kill() {
    let b = backend(0).await;
    for delay in [0u64, 100] {
        // Accepts connections and never answers a command; one per try,
        // so no connection of an earlier try is taken for this one's.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let store = format!("redis://{}", silent.local_addr().unwrap());
        let config = config_file(&file(&b, &store, ROUTES));
        let mut child = Command::new(env!("CARGO_BIN_EXE_norepeat-gateway"))
            .args([
                "--config",
                &config.to_string_lossy(),
                "--listen",
                "127.0.0.1:0",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        // The gateway is reaching its store: it read its file, and starts.
        let (_held, _) = tokio::time::timeout(Duration::from_secs(30), silent.accept())
            .await
            .expect("the store reached within 30 s")
            .unwrap();
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let pid = child.id().unwrap().to_string();
        assert!(
            Command::new("kill")
                .args(["-HUP", &pid])
                .status()
                .await
                .unwrap()
                .success()
        );
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("announced within 30 s")
            .unwrap();
        assert!(
            line.as_deref()
                .is_some_and(|l| l.starts_with("listening on")),
            "after a SIGHUP {delay} ms into reaching the store: {line:?}, exit {:?}",
            child.try_wait()
        );
        assert!(child.try_wait().unwrap().is_none(), "still running");
        let _ = std::fs::remove_file(config);
    }
}

/// Item 9: a request whose head the HTTP parser refused (answered 400 or
/// 431 by the parser itself, before any route) left no access-log line.
#[tokio::test]
async fn a_head_the_parser_refuses_has_its_access_log_line() {
    let b = backend(0).await;
    let log = AccessLog::new();
    let yaml = format!(
        "access_log: {}\n{}",
        log.display(),
        file(&b, "memory", ROUTES)
    );
    let g = gateway(&yaml).await;
    let text = over_tcp(
        &g,
        b"GET /plain HTTP/1.1\r\nhost: a\r\nbroken header line\r\n\r\n",
    )
    .await;
    assert_eq!(status(&text), 400, "{text}");
    let long = format!(
        "GET /plain HTTP/1.1\r\nhost: a\r\nx-big: {}\r\n\r\n",
        "x".repeat(600 * 1024)
    );
    let text = over_tcp(&g, long.as_bytes()).await;
    assert_eq!(status(&text), 431, "{text}");
    let lines = log_lines(&log, "\"invalid_request\"", 2).await;
    let seen: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(seen[0]["status"], 400, "{seen:?}");
    assert_eq!(seen[0]["method"], Value::Null);
    assert_eq!(seen[1]["status"], 431, "{seen:?}");
}

/// Item 2, HTTP/2: each stream may hold a backend connection, and two
/// client connections held 400. `limits.max_streams` is the connection's
/// `SETTINGS_MAX_CONCURRENT_STREAMS`: with 8, twenty requests sent at once
/// on one connection reach the backend 8 at a time, and all are served.
#[tokio::test]
async fn an_http2_connection_holds_at_most_max_streams_at_the_backend() {
    use http_body_util::{BodyExt, Full};
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let b = backend(0).await;
    let yaml = format!(
        "limits: {{ max_streams: 8 }}\n{}",
        file(&b, "memory", ROUTES)
    );
    let g = gateway(&yaml).await;
    let io = TokioIo::new(connect(&g).await);
    let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
        .await
        .unwrap();
    tokio::spawn(conn);
    let authority = format!("http://127.0.0.1:{}", g.port);
    // One exchange first: the gateway's SETTINGS are then the client's to
    // keep (streams opened before them past the cap are refused, which a
    // client retries: RFC 9113 §8.7).
    let mut first = send.clone();
    let req = http::Request::get(format!("{authority}/plain"))
        .body(Full::new(bytes::Bytes::new()))
        .unwrap();
    first.send_request(req).await.unwrap();
    let mut calls = Vec::new();
    for _ in 0..20 {
        let mut send = send.clone();
        let req = http::Request::post(format!("{authority}/slow-h2"))
            .header("x-delay", "2")
            .body(Full::new(bytes::Bytes::from_static(b"{}")))
            .unwrap();
        calls.push(tokio::spawn(async move {
            let res = send.send_request(req).await.unwrap();
            let status = res.status().as_u16();
            let _ = res.into_body().collect().await;
            status
        }));
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let at_once = effects(&b).await["/slow-h2"].as_u64().unwrap_or(0);
    assert!(at_once <= 8, "{at_once} at the backend at once");
    for c in calls {
        assert_eq!(c.await.unwrap(), 201);
    }
    assert_eq!(effects(&b).await["/slow-h2"], 20);
}
