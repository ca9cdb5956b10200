//! What a client connection may hold (`limits`): slow, silent and idle
//! connections, the connection cap, slow uploads and broken chunks.

use crate::common::*;

/// A gateway in front of `b` whose `limits` are `limits` (YAML lines).
async fn limited(b: &Process, limits: &str) -> Process {
    gateway(&format!(
        "upstream: http://127.0.0.1:{}\nstore: memory\nidentity:\n  header: X-User-Id\nlimits:\n{limits}\nroutes:\n  - match: POST /orders/quick\n    guard: fingerprint\n",
        b.port
    ))
    .await
}

/// Reads `s` to its end: `true` when the gateway closed it (or reset it)
/// within `within`, a deadline only a connection held open reaches.
async fn closed_within(s: &mut tokio::net::TcpStream, within: Duration) -> (bool, String) {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    let ended = tokio::time::timeout(within, s.read_to_end(&mut out)).await;
    (ended.is_ok(), String::from_utf8_lossy(&out).into_owned())
}

/// Issue 37, item 1: a connection costs the gateway nothing it cannot take
/// back. With `header_timeout`, `idle_timeout` and `body_timeout` of 1 s, a
/// silent connection, a head sent a line every 400 ms, a keep-alive
/// connection left idle after its answer and a body that stops half-way
/// are each closed, and counted (before: all four stayed open past 130 s).
#[tokio::test]
async fn silent_slow_and_idle_connections_are_closed_at_their_limits() {
    use tokio::io::AsyncWriteExt;
    let b = backend(0).await;
    let g = limited(
        &b,
        "  header_timeout: 1s\n  idle_timeout: 1s\n  body_timeout: 1s\n",
    )
    .await;
    let connect = || tokio::net::TcpStream::connect(("127.0.0.1", g.port));
    let within = Duration::from_secs(15);

    let mut silent = connect().await.unwrap();
    assert!(
        closed_within(&mut silent, within).await.0,
        "a silent connection stayed open"
    );

    // One header line every 400 ms: the head never completes in time.
    let mut slow = connect().await.unwrap();
    slow.write_all(b"GET /.norepeat/healthz HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let trickle = async {
        for i in 0..40 {
            tokio::time::sleep(Duration::from_millis(400)).await;
            if slow
                .write_all(format!("x-{i}: 1\r\n").as_bytes())
                .await
                .is_err()
            {
                return true;
            }
        }
        false
    };
    assert!(trickle.await, "a head sent a line at a time was never cut");

    // Keep-alive: answered, then idle.
    let mut idle = connect().await.unwrap();
    idle.write_all(b"GET /.norepeat/healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let (ended, text) = closed_within(&mut idle, within).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(ended, "an idle keep-alive connection stayed open");

    // A body that stops: 10 of the 100 bytes it announces.
    let mut body = connect().await.unwrap();
    body.write_all(
        b"POST /orders/quick HTTP/1.1\r\nhost: x\r\nx-user-id: u1\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"sku\":\"a",
    )
    .await
    .unwrap();
    let (ended, text) = closed_within(&mut body, within).await;
    assert!(ended, "a stalled body held its connection: {text}");
    assert!(!text.contains(" 201 "), "{text}");
    assert_eq!(effects(&b).await.get("/orders/quick"), None);

    let metrics = scrape(&g).await;
    for phase in ["head", "idle"] {
        assert!(
            value(
                &metrics,
                "norepeat_gateway_connections_timed_out_total",
                &format!("phase=\"{phase}\"")
            ) >= 1,
            "{phase} not counted"
        );
    }
}

/// Past `max_connections`, a new connection waits until one closes; it is
/// served then (before: no cap, and 1,100 silent connections made `accept`
/// fail and `/.norepeat/healthz` time out). The cap is the process's, not
/// a worker's: three keep-alive connections, wherever the kernel put them,
/// get two answers, and the third once one of those closes (with a cap per
/// worker, or a slot held by a worker waiting for a connection, all three
/// were answered, or the third never).
#[tokio::test]
async fn past_max_connections_a_new_one_waits_for_a_free_slot() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let b = backend(0).await;
    let g = limited(
        &b,
        "  header_timeout: 60s\n  idle_timeout: 60s\n  max_connections: 2\n",
    )
    .await;
    let mut reading = tokio::task::JoinSet::new();
    for i in 0..3 {
        let mut c = connect(&g).await;
        c.write_all(b"GET /.norepeat/healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        // Each reads its answer's first bytes, and hands back its socket.
        reading.spawn(async move {
            let mut head = [0u8; 12];
            let answered = tokio::time::timeout(Duration::from_secs(15), c.read_exact(&mut head))
                .await
                .is_ok();
            (i, answered, head, c)
        });
    }
    let mut answered = Vec::new();
    // The first two answers, within 15 s.
    for _ in 0..2 {
        let (i, ok, head, c) = reading.join_next().await.unwrap().unwrap();
        assert!(ok, "connection {i}: no answer within 15 s");
        assert_eq!(&head, b"HTTP/1.1 200", "connection {i}");
        answered.push(c);
    }
    // The third is not answered while both hold their slots.
    let third = tokio::time::timeout(Duration::from_millis(700), reading.join_next()).await;
    assert!(third.is_err(), "served past the cap");
    drop(answered.pop());
    let (i, ok, head, _) = reading.join_next().await.unwrap().unwrap();
    assert!(ok, "connection {i}: never served after a slot was freed");
    assert_eq!(&head, b"HTTP/1.1 200");
}

/// A streamed upload's route: no guard reads its body whole, so the body
/// goes upstream as it comes, and the route's `timeout` is 1 s.
const UPLOAD_ROUTE: &str = "
  - match: POST /upload
    rate_limit: {rate: 1000/s}
    timeout: 1s
";

/// Issue 37, item 1: a route's upstream `timeout` counts from the
/// request's last body byte (a slow upload is not the backend's fault:
/// before, a 2.5 s upload on a 1 s route was 504), and a client body that
/// breaks (a malformed chunk) is the client's 400, never 504, and does not
/// use up a token (before: 504 `upstream_timeout`, and the token spent).
#[tokio::test]
async fn a_slow_upload_is_not_the_backends_time_and_a_broken_chunk_is_400() {
    use tokio::io::AsyncWriteExt;
    let b = backend(0).await;
    let routes = format!("{UPLOAD_ROUTE}  - match: POST /orders\n    guard: token\n");
    let g = gateway(&file(&b, "memory", &routes)).await;
    let connect = || tokio::net::TcpStream::connect(("127.0.0.1", g.port));
    let mut slow = connect().await.unwrap();
    slow.write_all(
        b"POST /upload HTTP/1.1\r\nhost: x\r\nx-user-id: u1\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    for _ in 0..5 {
        slow.write_all(b"4\r\nslow\r\n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    slow.write_all(b"0\r\n\r\n").await.unwrap();
    let (_, text) = closed_within(&mut slow, Duration::from_secs(15)).await;
    assert!(text.starts_with("HTTP/1.1 201"), "{text}");

    let token = token_for(&g, "u1").await;
    let token = token["repeatToken"].as_str().unwrap();
    let mut broken = connect().await.unwrap();
    broken
        .write_all(
            format!(
                "POST /orders HTTP/1.1\r\nhost: x\r\nx-user-id: u1\r\nrepeat-token: {token}\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n4\r\nabcd\r\nZZ\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let (_, text) = closed_within(&mut broken, Duration::from_secs(15)).await;
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains("invalid_request"), "{text}");
    let again = Client::new()
        .post(url(&g, "/orders"))
        .header("x-user-id", "u1")
        .header("repeat-token", token)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 201, "the broken request used up the token");
}

/// A client that pauses mid-upload longer than the route's `timeout`
/// (well within `body_timeout`) is the client's time: its request reaches
/// the backend whole and is answered, once. Before, the upstream's
/// `timeout` counted the pause: 504 `upstream_timeout` after 1 s, an
/// unknown outcome, and the backend saw the request cut half-way (a full
/// test run under load, with pauses of 500 ms stretched past 1 s, failed
/// on it).
#[tokio::test]
async fn a_pause_mid_upload_past_the_routes_timeout_is_the_clients_time() {
    use tokio::io::AsyncWriteExt;
    let b = backend(0).await;
    let g = gateway(&file(&b, "memory", UPLOAD_ROUTE)).await;
    let mut slow = tokio::net::TcpStream::connect(("127.0.0.1", g.port))
        .await
        .unwrap();
    slow.write_all(
        b"POST /upload HTTP/1.1\r\nhost: x\r\nx-user-id: u1\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n4\r\nslow\r\n",
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1600)).await;
    slow.write_all(b"4\r\nslow\r\n0\r\n\r\n").await.unwrap();
    let (_, text) = closed_within(&mut slow, Duration::from_secs(15)).await;
    assert!(text.starts_with("HTTP/1.1 201"), "{text}");
    assert_eq!(effects(&b).await["/upload"], 1);
}
