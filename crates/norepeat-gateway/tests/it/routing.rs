// Over 400 lines: every spelling of a path and what it reaches, through the binary, sharing one backend that echoes.
//! What a route takes and what passes through: spellings of a path,
//! methods, forwarding headers, bodies streamed and capped, routes that
//! only route.

use crate::common::*;

#[tokio::test]
async fn an_unmatched_request_streams_through_without_hop_by_hop_headers() {
    let b = backend(0).await;
    let g = gateway(&file(&b, "memory", ROUTES)).await;
    let c = Client::new();
    let res = c
        .get(url(&g, "/echo"))
        .header("connection", "x-secret")
        .header("x-secret", "1")
        .header("te", "trailers")
        .header("x-forwarded-for", "203.0.113.9")
        .header("x-kept", "yes")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(
        res.headers().get("keep-alive").is_none(),
        "{:?}",
        res.headers()
    );
    assert!(res.headers().get("proxy-connection").is_none());
    let seen: Value = res.json().await.unwrap();
    assert!(seen.get("x-secret").is_none(), "{seen}");
    assert!(seen.get("te").is_none(), "{seen}");
    assert_eq!(seen["x-kept"], "yes");
    // The client is no trusted proxy: what it wrote is replaced.
    assert_eq!(seen["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen["x-forwarded-proto"], "http");
    assert_eq!(
        seen["host"],
        format!("127.0.0.1:{}", g.port),
        "Host as the client sent it"
    );
    assert_eq!(seen["x-forwarded-host"], format!("127.0.0.1:{}", g.port));
    assert!(
        seen["forwarded"]
            .as_str()
            .unwrap()
            .starts_with("for=127.0.0.1;proto=http")
    );
    let big = c
        .get(url(&g, "/big"))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(big.len(), 2 * 1024 * 1024);
    // A request body far over any guard's cap streams through an unmatched route.
    let upload = c
        .post(url(&g, "/upload"))
        .body(vec![b'u'; 3 * 1024 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(upload.status(), 201);
    assert_eq!(effects(&b).await["/upload"], 1);
}

/// `max_request_body` holds on a route whose body is streamed (a rate
/// limit alone here): a body declared larger is refused before it is sent,
/// one that grows larger while it streams (chunked) is cut off and
/// refused too, both 413 `payload_too_large`; a small one passes.
#[tokio::test]
async fn a_streamed_routes_body_is_capped_at_its_max_request_body() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let b = backend(0).await;
    let routes = "
  - match: POST /limited
    rate_limit: {rate: 1000/s}
    max_request_body: 100
";
    let g = gateway(&file(&b, "memory", routes)).await;
    let c = Client::new();
    let small = c
        .post(url(&g, "/limited"))
        .header("x-user-id", "u1")
        .body("x".repeat(50))
        .send()
        .await
        .unwrap();
    assert_eq!(small.status(), 201);
    let declared = c
        .post(url(&g, "/limited"))
        .header("x-user-id", "u1")
        .body("x".repeat(5000))
        .send()
        .await
        .unwrap();
    assert_eq!(
        code(declared).await,
        (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large".into())
    );
    // Chunked: no length to refuse it by; cut off once past 100 bytes.
    let mut req = String::from(
        "POST /limited HTTP/1.1\r\nhost: x\r\nx-user-id: u1\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
    );
    for _ in 0..50 {
        req.push_str(&format!("64\r\n{}\r\n", "y".repeat(100)));
    }
    req.push_str("0\r\n\r\n");
    // The gateway answers and closes before the body is all sent, and a
    // close with unread bytes resets the connection, which can discard the
    // answer before the client reads it (seen under load; NGINX's
    // `lingering_close` is the server-side cure, not built yet). A reset
    // proves nothing either way: try again; any answer must be the 413.
    let mut answer = String::new();
    for _ in 0..5 {
        let con = connect(&g).await;
        let (mut read, mut write) = con.into_split();
        let sent = req.clone();
        let writer = tokio::spawn(async move {
            let _ = write.write_all(sent.as_bytes()).await;
            write
        });
        let mut got = Vec::new();
        let _ = read.read_to_end(&mut got).await;
        let _ = writer.await;
        answer = String::from_utf8_lossy(&got).into_owned();
        if !answer.is_empty() {
            break;
        }
    }
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("payload_too_large"), "{answer}");
}

/// A request a backend could read otherwise than the gateway did is
/// answered 400 problem+json by the gateway and never forwarded (RFC 9112):
/// a target that is not a path (`OPTIONS *`, which before got a 502 that
/// blamed a backend which was up), two `Host` headers. (Both `Content-Length` and `Transfer-Encoding`: hyper reads
/// the body by the latter alone and drops the former, so the request
/// leaves with one framing.)
#[tokio::test]
async fn a_request_a_backend_could_read_otherwise_is_400_not_forwarded() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let b = backend(0).await;
    let g = gateway(&file(&b, "memory", ROUTES)).await;
    let before = effects(&b).await;
    for (what, head) in [
        (
            "OPTIONS *",
            "OPTIONS * HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n",
        ),
        (
            "POST *",
            "POST * HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n",
        ),
        (
            "two Host headers",
            "POST /echo HTTP/1.1\r\nhost: a\r\nhost: b\r\ncontent-length: 0\r\n",
        ),
    ] {
        let mut con = connect(&g).await;
        con.write_all(format!("{head}connection: close\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut answer = String::new();
        let _ = con.read_to_string(&mut answer).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{what}: {answer}");
        assert!(
            answer.contains("application/problem+json") && answer.contains("invalid_request"),
            "{what}: {answer}"
        );
    }
    assert_eq!(
        effects(&b).await,
        before,
        "a malformed request was forwarded"
    );
    // The gateway's own routes: another method is 405 problem+json.
    let res = Client::new()
        .post(url(&g, "/.norepeat/token"))
        .send()
        .await
        .unwrap();
    assert!(res.headers().contains_key("allow"), "{:?}", res.headers());
    assert_eq!(
        code(res).await,
        (StatusCode::METHOD_NOT_ALLOWED, "invalid_request".into())
    );
}

/// Item 3 of issue 26: every spelling of a guarded path that a backend may
/// serve as the same resource goes through the route's guard. Without a
/// key each is refused 400 (nothing reaches the backend); with one, those
/// that normalize to `/payments` replay the first answer.
#[tokio::test]
async fn every_spelling_of_a_guarded_path_is_guarded() {
    let b = backend(0).await;
    let g = gateway(&file(&b, "memory", ROUTES)).await;
    let user = [("x-user-id", "u1")];
    let variants = [
        "/payments",
        "/payments/",
        "//payments",
        "/./payments",
        "/pay%6Dents",
        "/pay%6dents",
        "/x/../payments",
        "/%2E/payments",
        "/payments;v=1",
        "/payments?x=1",
    ];
    for path in variants {
        let (status, text) = raw(&g, &format!("POST {path}"), &user, "{}").await;
        assert_eq!(status, 400, "{path} went unguarded: {text}");
        assert!(text.contains("missing_idempotency_key"), "{path}: {text}");
    }
    assert_eq!(
        effects(&b).await,
        serde_json::json!({}),
        "nothing reached the backend"
    );
    let keyed = [("x-user-id", "u1"), ("idempotency-key", "k-path")];
    let (status, first) = raw(&g, "POST /payments", &keyed, "{}").await;
    assert_eq!(status, 201, "{first}");
    for path in ["//payments", "/./payments", "/pay%6Dents", "/x/../payments"] {
        let (status, text) = raw(&g, &format!("POST {path}"), &keyed, "{}").await;
        assert_eq!(status, 201, "{path}: {text}");
        assert!(
            text.to_ascii_lowercase()
                .contains("idempotent-replayed: true"),
            "{path}: {text}"
        );
    }
    // A fingerprint route too: the same order under another spelling.
    let order = [("x-user-id", "u1"), ("content-type", "application/json")];
    assert_eq!(
        raw(&g, "POST /orders/quick", &order, r#"{"sku":"p"}"#)
            .await
            .0,
        201
    );
    assert_eq!(
        raw(&g, "POST //orders/./quick", &order, r#"{"sku":"p"}"#)
            .await
            .0,
        409
    );
    let e = effects(&b).await;
    assert_eq!(
        e,
        serde_json::json!({"/payments": 1, "/orders/quick": 1}),
        "the backend got the normalized path"
    );
    // An unmatched request is forwarded untouched.
    assert_eq!(raw(&g, "POST /other//./x", &[], "{}").await.0, 201);
    assert_eq!(effects(&b).await["/other//./x"], 1);
}

/// A method that is not in upper case is refused 400 and never forwarded:
/// werkzeug runs `post /payments` as POST, so a lower-case spelling would
/// pass every guard (before: a `post` with no `Idempotency-Key` reached the
/// backend and was served, and `post` walked past a 429).
#[tokio::test]
async fn a_method_not_in_upper_case_is_400_and_never_forwarded() {
    let b = backend(0).await;
    let g = gateway(&file(&b, "memory", ROUTES)).await;
    for method in ["post", "Post", "pOST"] {
        for path in ["/payments", "/flash-sale/sku1", "/unrouted"] {
            let (status, body) = raw(
                &g,
                &format!("{method} {path}"),
                &[("x-user-id", "u1"), ("content-type", "application/json")],
                "{}",
            )
            .await;
            assert_eq!(status, 400, "{method} {path}: {body}");
            assert!(body.contains("invalid_request"), "{body}");
        }
    }
    let e = effects(&b).await;
    assert_eq!(e.as_object().map(|o| o.len()), Some(0), "forwarded: {e}");
}

/// Issue 37, item 2: one key, one effect, whatever the spelling. A route
/// that takes `/payments`, `/payments/`, `/payments;jsessionid=A1`,
/// `/pay%6dents;x`, `/x/..;/payments` (Tomcat drops `;x` before it
/// resolves `..`) and `/payments.json` (Rails drops the format) keys them
/// as its one spelling: one payment, the others replays (before: behind
/// Jetty, one key and one body made five payments). An encoded slash that
/// decodes onto a route, and a route's path in another case, are refused
/// 400 and never forwarded (before: Flask ran `/payments%2F` unguarded, and
/// `/flash-sale%2Fsku1` skipped the rate limit).
#[tokio::test]
async fn every_spelling_of_a_route_is_one_key_and_the_dangerous_ones_are_refused() {
    let b = backend(0).await;
    let g = gateway(&file(&b, "memory", ROUTES)).await;
    let keyed = [("x-user-id", "u1"), ("idempotency-key", "k-one")];
    let (status, first) = raw(&g, "POST /payments", &keyed, "{}").await;
    assert_eq!(status, 201, "{first}");
    for path in [
        "/payments/",
        "/payments;jsessionid=A1",
        "/pay%6dents;x",
        "/x/..;/payments",
        "/payments.json",
        "/payments.json/",
    ] {
        let (status, text) = raw(&g, &format!("POST {path}"), &keyed, "{}").await;
        assert_eq!(status, 201, "{path}: {text}");
        assert!(
            text.to_ascii_lowercase()
                .contains("idempotent-replayed: true"),
            "{path} ran again: {text}"
        );
    }
    // The fingerprint is the route's too: the same order, another spelling.
    let order = [("x-user-id", "u1"), ("content-type", "application/json")];
    assert_eq!(
        raw(&g, "POST /orders/quick", &order, r#"{"sku":"s"}"#)
            .await
            .0,
        201
    );
    for path in ["/orders/quick/", "/orders/quick;v=2", "/orders/quick.json"] {
        assert_eq!(
            raw(&g, &format!("POST {path}"), &order, r#"{"sku":"s"}"#)
                .await
                .0,
            409,
            "{path}"
        );
    }
    let user = [("x-user-id", "u1")];
    for path in [
        "/payments%2F",
        "/payments%2f",
        "/flash-sale%2Fsku1",
        "/x%2F..%2Fpayments",
        "/Payments",
        "/PAYMENTS/",
        "/Payments.json",
        "/Flash-Sale/sku1",
    ] {
        let (status, text) = raw(&g, &format!("POST {path}"), &user, "{}").await;
        assert_eq!(status, 400, "{path}: {text}");
        assert!(text.contains("invalid_request"), "{path}: {text}");
    }
    let e = effects(&b).await;
    let total: u64 = e
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(total, 2, "one payment and one order: {e}");
    // A path that is no route's in any spelling is forwarded untouched.
    assert_eq!(raw(&g, "POST /other%2Fthing.json", &[], "{}").await.0, 201);
}

/// Issue 37, item 3: forwarding headers from a peer outside
/// `trusted_proxies` are replaced, not appended to (before: a client's
/// `X-Forwarded-For: 6.6.6.6` reached the backend as `6.6.6.6, 127.0.0.1`);
/// from a trusted proxy they are appended to. An absolute-form target's
/// authority is the `Host` forwarded (RFC 9112 §3.2.2), and an HTTP/1.1
/// request without `Host` is 400, never forwarded (RFC 9112 §3.2).
#[tokio::test]
async fn forwarding_headers_host_and_the_request_target_are_the_gateways_to_say() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let b = backend(0).await;
    let echo = |g: &Process| {
        Client::new()
            .get(url(g, "/echo"))
            .header("x-forwarded-for", "6.6.6.6")
            .header("forwarded", "for=6.6.6.6")
            .header("x-forwarded-host", "evil.example")
            .header("x-forwarded-proto", "https")
            .send()
    };
    let g = gateway(&file(&b, "memory", ROUTES)).await;
    let seen: Value = echo(&g).await.unwrap().json().await.unwrap();
    assert_eq!(seen["x-forwarded-for"], "127.0.0.1", "{seen}");
    assert_eq!(seen["x-forwarded-proto"], "http");
    assert_eq!(seen["x-forwarded-host"], format!("127.0.0.1:{}", g.port));
    let forwarded = seen["forwarded"].as_str().unwrap();
    assert!(!forwarded.contains("6.6.6.6"), "{forwarded}");
    // Behind a trusted proxy: appended to.
    let trusting = format!(
        "upstream: http://127.0.0.1:{}\nstore: memory\nidentity:\n  header: X-User-Id\n  trusted_proxies: [127.0.0.0/8]\n",
        b.port
    );
    let t = gateway(&trusting).await;
    let seen: Value = echo(&t).await.unwrap().json().await.unwrap();
    assert_eq!(seen["x-forwarded-for"], "6.6.6.6, 127.0.0.1", "{seen}");

    let send = |head: &'static str| {
        let port = g.port;
        async move {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap();
            s.write_all(head.as_bytes()).await.unwrap();
            let mut out = Vec::new();
            s.read_to_end(&mut out).await.unwrap();
            String::from_utf8_lossy(&out).into_owned()
        }
    };
    let absolute = send(
        "GET http://other.example/echo HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(absolute.starts_with("HTTP/1.1 200"), "{absolute}");
    assert!(
        absolute.contains("\"host\": \"other.example\""),
        "{absolute}"
    );
    let before = effects(&b).await;
    let no_host =
        send("POST /payments HTTP/1.1\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").await;
    assert!(no_host.starts_with("HTTP/1.1 400"), "{no_host}");
    assert!(no_host.contains("Host"), "{no_host}");
    assert_eq!(effects(&b).await, before, "forwarded without Host");
}

/// Issue 38, item 1: a route may only route (its own `upstream`, no
/// guard), a `match` may end in a prefix (`ANY /api/{*rest}`) and a route
/// may name a `host`. Requests for other sites, and paths outside the
/// prefix, go to the file's upstream; a routing route is no guard, so
/// another spelling of its path is forwarded, not refused; its bodies are
/// not capped at the guards' 64 KiB.
#[tokio::test]
async fn a_route_may_route_a_prefix_of_one_host_to_its_own_upstream() {
    let main = backend(0).await;
    let api = backend(0).await;
    let routes = format!(
        "
  - match: ANY /api/{{*rest}}
    host: api.example.com
    upstream: http://127.0.0.1:{}
",
        api.port
    );
    let g = gateway(&file(&main, "memory", &routes)).await;
    let send = |method: reqwest::Method, host: &'static str, path: &'static str, body: Vec<u8>| {
        Client::new()
            .request(method, url(&g, path))
            .header("host", host)
            .body(body)
            .send()
    };
    let big = vec![b'x'; 200 * 1024];
    for (method, path) in [
        (reqwest::Method::POST, "/api/orders"),
        (reqwest::Method::POST, "/api/v1/users/7"),
        (reqwest::Method::POST, "/api"),
    ] {
        let res = send(method, "API.example.com", path, big.clone())
            .await
            .unwrap();
        assert_eq!(res.status(), 201, "{path}");
    }
    assert_eq!(effects(&api).await["/api/orders"], 1);
    assert_eq!(effects(&api).await["/api/v1/users/7"], 1);
    assert_eq!(effects(&api).await["/api"], 1);
    // Another site, and a path outside the prefix: the file's upstream.
    let other = send(
        reqwest::Method::POST,
        "www.example.com",
        "/api/orders",
        Vec::new(),
    );
    assert_eq!(other.await.unwrap().status(), 201);
    let outside = send(
        reqwest::Method::POST,
        "api.example.com",
        "/apis",
        Vec::new(),
    );
    assert_eq!(outside.await.unwrap().status(), 201);
    let folded = send(
        reqwest::Method::POST,
        "api.example.com",
        "/API/orders",
        Vec::new(),
    );
    assert_eq!(folded.await.unwrap().status(), 201, "no guard to pass by");
    assert_eq!(effects(&main).await["/api/orders"], 1);
    assert_eq!(effects(&main).await["/apis"], 1);
    assert_eq!(effects(&main).await["/API/orders"], 1);
    assert_eq!(effects(&api).await["/api/orders"], 1, "only its site");
}

/// A guarded route for one site leaves another site's request on the
/// same path alone when the file says so (`hosts` names both sites, and a
/// route of its own routes the other site's requests unguarded), while its
/// own site's is guarded. Before, the other site's request met the
/// spelling check of a route that was not its own and got 400. (Without
/// such a route, any Host but the guarded one would walk past the guard
/// to the same backend: `check` refuses that file, issue 52.)
#[tokio::test]
async fn a_guarded_route_for_one_site_leaves_other_sites_alone() {
    let b = backend(0).await;
    let routes = format!(
        "
  - match: POST /payments
    host: a.example
    guard: idempotency
  - match: POST /payments
    host: b.example
    upstream: http://127.0.0.1:{}
",
        b.port
    );
    let yaml = format!(
        "hosts: [a.example, b.example]\n{}",
        file(&b, "memory", &routes)
    );
    let g = gateway(&yaml).await;
    let send = |host: &'static str| {
        Client::new()
            .post(url(&g, "/payments"))
            .header("host", host)
            .header("x-user-id", "u1")
            .body("{}")
            .send()
    };
    assert_eq!(
        send("b.example").await.unwrap().status(),
        201,
        "not a.example's route"
    );
    assert_eq!(
        code(send("a.example").await.unwrap()).await,
        (StatusCode::BAD_REQUEST, "missing_idempotency_key".into()),
        "its own site is guarded"
    );
    assert_eq!(effects(&b).await["/payments"], 1);
}

/// A routing-only catch-all listed after a guarded route does not let
/// another spelling of the guarded one past it: `/api/payments.json` (a
/// format suffix Rails drops), `/api/Payments` (case a back end may fold)
/// and `/api/x%2F..%2Fpayments` (an encoded slash Flask decodes) are the
/// guarded route or refused, never forwarded unguarded by the catch-all
/// (before: all three reached the backend with no `Idempotency-Key`).
/// Other paths under the prefix still go through the catch-all.
#[tokio::test]
async fn a_catch_all_after_a_guarded_route_lets_no_spelling_of_it_past() {
    let main = backend(0).await;
    let api = backend(0).await;
    let routes = format!(
        "
  - match: POST /api/payments
    guard: idempotency
    upstream: http://127.0.0.1:{0}
  - match: ANY /api/{{*rest}}
    upstream: http://127.0.0.1:{0}
",
        api.port
    );
    let g = gateway(&file(&main, "memory", &routes)).await;
    let post = |path: &'static str| {
        Client::new()
            .post(url(&g, path))
            .header("x-user-id", "u1")
            .body("{}")
            .send()
    };
    let (status, code) = crate::common::code(post("/api/payments.json").await.unwrap()).await;
    assert_eq!(
        (status.as_u16(), code.as_str()),
        (400, "missing_idempotency_key")
    );
    for path in ["/api/Payments", "/api/x%2F..%2Fpayments"] {
        let (status, code) = crate::common::code(post(path).await.unwrap()).await;
        assert_eq!(
            (status.as_u16(), code.as_str()),
            (400, "invalid_request"),
            "{path}"
        );
    }
    let other = post("/api/orders").await.unwrap();
    assert_eq!(other.status(), 201, "the catch-all still routes");
    let seen = effects(&api).await;
    assert_eq!(seen["/api/orders"], 1);
    for path in [
        "/api/payments.json",
        "/api/Payments",
        "/api/payments",
        "/api/x/../payments",
    ] {
        assert!(
            seen[path].is_null() || seen[path] == 0,
            "{path} reached the backend: {seen}"
        );
    }
}
