// Over 400 lines: every framing a backend may answer with, spoken by hand over one raw backend the tests share.
//! HTTP/1.1 spoken by hand (issue 39): the pass-through's lane
//! (`serve/listen/lane.rs`) and a route's upstream exchange of a request
//! whose body is in hand (`serve/upstream/exchange.rs`). The lane takes unguarded
//! HTTP/1.1 requests without a body, read and written by the gateway
//! itself. Every answer framing a backend may use comes through whole and
//! leaves the client's connection usable; pipelined requests, and requests
//! the lane leaves to hyper in the middle of a connection, are answered in
//! order; a head sent a byte at a time is served; a broken answer is a 504
//! or a closed connection, never a wrong body; an idle connection does not
//! hold the shutdown. The backend is a raw TCP server in the test, which
//! answers each path with the bytes below and keeps the heads it read.

use crate::common::*;
use http_body_util::BodyExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The backend's answer to `path` (`None`: read the request, then close).
fn answer(method: &str, path: &str) -> Option<&'static [u8]> {
    Some(match (method, path) {
        ("HEAD", _) => b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
        (_, "/plain" | "/slow" | "/items/1") => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        // No length: the body ends with the connection.
        (_, "/until-close") => b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nstreamed to the end",
        (_, "/chunked" | "/pay/chunked") => b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n2\r\nde\r\n0\r\nx-sum: 5\r\n\r\n",
        // A coding before `chunked` (the bytes stand for gzip's).
        (_, "/gzip") => b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        (_, "/early-hints") => b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        (_, "/no-content") => b"HTTP/1.1 204 No Content\r\n\r\n",
        (_, "/hop") => b"HTTP/1.1 200 OK\r\nconnection: x-internal\r\nx-internal: 1\r\nkeep-alive: timeout=5\r\nx-request-id: the-backends\r\nx-kept: yes\r\ncontent-length: 2\r\n\r\nok",
        (_, "/two-lengths") => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nok",
        (_, "/cut-short") => b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc",
        (_, "/upload") => b"HTTP/1.1 201 Created\r\ncontent-length: 7\r\n\r\ncreated",
        (_, "/reason") => b"HTTP/1.1 200 Fine Thanks\r\ncontent-length: 2\r\n\r\nok",
        _ => return None,
    })
}

/// The backend: its port, the connections it accepted, the heads it read.
struct Backend {
    port: u16,
    connections: Arc<AtomicUsize>,
    heads: Arc<Mutex<Vec<String>>>,
}

async fn backend() -> Backend {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let connections = Arc::new(AtomicUsize::new(0));
    let heads = Arc::new(Mutex::new(Vec::new()));
    let (c, h) = (Arc::clone(&connections), Arc::clone(&heads));
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(s, Arc::clone(&h)));
        }
    });
    Backend {
        port,
        connections,
        heads,
    }
}

/// One request from `s`, read a byte at a time up to its head's end, then
/// its body (by its `Content-Length`): its head as text, or `None` once
/// the connection ends first.
async fn read_request(s: &mut tokio::net::TcpStream) -> Option<String> {
    let head = read_head_bytes(s).await?;
    let text = String::from_utf8_lossy(&head).into_owned();
    let length = text
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse::<usize>().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    s.read_exact(&mut body).await.ok()?;
    Some(text)
}

/// A backend that answers each connection's one request with `answer`,
/// then (`closes`) closes its end 200 ms later, and reports whether the
/// gateway's end of that connection closed within 5 s.
async fn watching_backend(
    answer: &'static [u8],
    closes: bool,
) -> (u16, tokio::sync::mpsc::UnboundedReceiver<bool>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (ended, closed) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let ended = ended.clone();
            tokio::spawn(async move {
                if read_request(&mut s).await.is_none() {
                    return;
                }
                s.write_all(answer).await.unwrap();
                if closes {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    s.shutdown().await.unwrap();
                }
                let mut rest = [0u8; 16];
                let read = tokio::time::timeout(Duration::from_secs(5), s.read(&mut rest)).await;
                let _ = ended.send(matches!(read, Ok(Ok(0) | Err(_))));
            });
        }
    });
    (port, closed)
}

async fn serve(mut s: tokio::net::TcpStream, heads: Arc<Mutex<Vec<String>>>) {
    loop {
        let Some(text) = read_request(&mut s).await else {
            return;
        };
        let mut words = text.split(' ');
        let (method, path) = (
            words.next().unwrap().to_owned(),
            words.next().unwrap().to_owned(),
        );
        heads.lock().unwrap().push(text);
        if path == "/slow" {
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        let Some(bytes) = answer(&method, &path) else {
            return;
        };
        if s.write_all(bytes).await.is_err() {
            return;
        }
        let framed = bytes
            .windows(15)
            .any(|w| w.eq_ignore_ascii_case(b"content-length:"))
            || bytes
                .windows(18)
                .any(|w| w.eq_ignore_ascii_case(b"transfer-encoding:"))
            || bytes.starts_with(b"HTTP/1.1 204")
            || method == "HEAD";
        if !framed || path == "/cut-short" {
            let _ = s.shutdown().await;
            return;
        }
    }
}

async fn gateway_for(b: &Backend) -> Process {
    let yaml = format!(
        "upstream: http://127.0.0.1:{}\nstore: memory\nroutes:\n  - match: POST /orders\n    guard: fingerprint\n",
        b.port
    );
    gateway_with(&yaml, &["--workers", "1"]).await
}

/// A gateway in front of `b` that stops accepting as soon as it is told
/// to stop (`drain_delay: 0s`).
async fn stopping_at_once(b: &Backend) -> Process {
    let yaml = format!(
        "upstream: http://127.0.0.1:{}\nstore: memory\ndrain_delay: 0s\n",
        b.port
    );
    gateway_with(&yaml, &["--workers", "1"]).await
}

/// One client connection to `g`, spoken to by hyper's client: a request
/// on it fails once the gateway has closed it.
async fn connection(
    g: &Process,
) -> hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>> {
    let s = connect(g).await;
    let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    send
}

/// `method path` on `send`'s connection: the status, the headers, the body.
async fn ask(
    send: &mut hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>,
    method: &str,
    path: &str,
) -> (u16, http::HeaderMap, String) {
    send.ready().await.expect("the connection is still open");
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "shop.test")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let res = send.send_request(req).await.expect("an answer");
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let body = res.into_body().collect().await.expect("a whole body");
    (
        status,
        headers,
        String::from_utf8_lossy(&body.to_bytes()).into_owned(),
    )
}

/// Each framing on one client connection, in turn, the connection kept:
/// a body that ends with the upstream's connection comes chunked (and a
/// new upstream connection serves the next request), a chunked one with
/// its extension and trailers comes decoded whole, a 103 is passed over,
/// a transfer coding before `chunked` is kept for the client to undo,
/// a 204 and a `HEAD` have no body, and the answer's hop-by-hop headers
/// (those its `Connection` names too) are dropped, its request id is the
/// gateway's, and one without a `Date` gets the gateway's.
#[tokio::test]
async fn every_answer_framing_comes_whole_on_a_kept_connection() {
    let b = backend().await;
    let g = gateway_for(&b).await;
    let mut send = connection(&g).await;
    let (_, headers, body) = ask(&mut send, "GET", "/plain").await;
    assert_eq!(body, "ok");
    // The backend sent no Date: the gateway's, as hyper's server adds.
    let date = headers["date"].to_str().unwrap();
    assert!(httpdate::parse_http_date(date).is_ok(), "{date}");
    let (status, headers, body) = ask(&mut send, "GET", "/until-close").await;
    assert_eq!((status, body.as_str()), (200, "streamed to the end"));
    assert_eq!(headers["transfer-encoding"], "chunked");
    assert_eq!(headers["content-type"], "text/plain");
    assert_eq!(ask(&mut send, "GET", "/chunked").await.2, "abcde");
    let (_, headers, body) = ask(&mut send, "GET", "/gzip").await;
    assert_eq!(headers["transfer-encoding"], "gzip, chunked");
    assert_eq!(body, "abc");
    let (status, _, body) = ask(&mut send, "GET", "/early-hints").await;
    assert_eq!((status, body.as_str()), (200, "ok"));
    let (status, _, body) = ask(&mut send, "GET", "/no-content").await;
    assert_eq!((status, body.as_str()), (204, ""));
    let (status, headers, body) = ask(&mut send, "HEAD", "/plain").await;
    assert_eq!((status, body.as_str()), (200, ""));
    assert_eq!(headers["content-length"], "5");
    let (status, headers, body) = ask(&mut send, "GET", "/hop").await;
    assert_eq!((status, body.as_str()), (200, "ok"));
    for dropped in ["connection", "x-internal", "keep-alive"] {
        assert!(headers.get(dropped).is_none(), "{dropped}: {headers:?}");
    }
    assert_eq!(headers["x-kept"], "yes");
    assert_eq!(headers.get_all("x-request-id").iter().count(), 1);
    assert_ne!(headers["x-request-id"], "the-backends");
    assert_eq!(ask(&mut send, "GET", "/plain").await.2, "ok");
    // The request as the backend read it: its own id, the forwarding
    // headers, `Host` as sent.
    let first = b.heads.lock().unwrap()[0].to_ascii_lowercase();
    assert!(first.starts_with("get /plain http/1.1\r\n"), "{first}");
    assert!(first.contains("\r\nhost: shop.test\r\n"), "{first}");
    assert!(
        first.contains("\r\nx-forwarded-for: 127.0.0.1\r\n"),
        "{first}"
    );
    assert!(
        first.contains("\r\nx-forwarded-host: shop.test\r\n"),
        "{first}"
    );
    assert!(
        first.contains("\r\nforwarded: for=127.0.0.1;proto=http;host=\"shop.test\"\r\n"),
        "{first}"
    );
    assert_eq!(first.matches("x-request-id: ").count(), 1, "{first}");
    // One upstream connection, and one more after the answer that ended
    // with its own.
    assert_eq!(b.connections.load(Ordering::SeqCst), 2);
}

/// Three requests in one write: the lane answers the first, leaves the
/// upload (a body) to hyper with the bytes it has read, and hyper answers
/// the rest, in order.
#[tokio::test]
async fn pipelined_requests_and_one_left_to_hyper_are_answered_in_order() {
    let b = backend().await;
    let g = gateway_for(&b).await;
    let text = over_tcp(
        &g,
        b"GET /plain HTTP/1.1\r\nhost: a\r\n\r\n\
          POST /upload HTTP/1.1\r\nhost: a\r\ncontent-length: 5\r\n\r\nhello\
          GET /chunked HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
    )
    .await;
    let statuses: Vec<&str> = text
        .match_indices("HTTP/1.1 ")
        .map(|(i, _)| &text[i + 9..i + 12])
        .collect();
    assert_eq!(statuses, ["200", "201", "200"], "{text}");
    let created = text.find("created").expect("the upload's answer");
    assert!(text.find("\r\n\r\nok").unwrap() < created, "{text}");
    assert!(text[created..].contains("abc"), "{text}");
    let heads = b.heads.lock().unwrap();
    let paths: Vec<&str> = heads.iter().map(|h| h.split(' ').nth(1).unwrap()).collect();
    assert_eq!(paths, ["/plain", "/upload", "/chunked"]);
}

/// A head sent a byte at a time (within `header_timeout`) is read whole
/// and answered.
#[tokio::test]
async fn a_head_sent_a_byte_at_a_time_is_served() {
    let b = backend().await;
    let g = gateway_for(&b).await;
    let mut s = connect(&g).await;
    s.set_nodelay(true).unwrap();
    for byte in b"GET /plain HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n" {
        s.write_all(&[*byte]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let out = read_rest(&mut s).await;
    assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
    assert!(out.ends_with("\r\n\r\nok"), "{out}");
}

/// An answer with two lengths is not passed on: 504 `upstream_timeout`
/// (the request went, the outcome is unknown), the client's connection
/// kept. One cut short ends the client's connection before the length it
/// announced: never a whole-looking wrong body.
#[tokio::test]
async fn a_broken_answer_is_a_504_or_a_connection_cut_never_a_wrong_body() {
    let b = backend().await;
    let g = gateway_for(&b).await;
    let mut send = connection(&g).await;
    let (status, headers, body) = ask(&mut send, "GET", "/two-lengths").await;
    assert_eq!(status, 504, "{body}");
    assert_eq!(headers["content-type"], "application/problem+json");
    assert!(body.contains("\"code\":\"upstream_timeout\""), "{body}");
    assert!(headers.contains_key("x-request-id"));
    assert_eq!(ask(&mut send, "GET", "/plain").await.2, "ok");

    let text = over_tcp(&g, b"GET /cut-short HTTP/1.1\r\nhost: a\r\n\r\n").await;
    assert!(text.contains("content-length: 10\r\n"), "{text}");
    assert!(text.ends_with("\r\n\r\nabc"), "{text}");
}

/// A client's idle keep-alive connection does not hold the shutdown: the
/// gateway exits at once after `SIGTERM` (it waited for its 10 s grace
/// with the connection left open).
#[tokio::test]
async fn an_idle_connection_does_not_hold_the_shutdown() {
    let b = backend().await;
    let mut g = stopping_at_once(&b).await;
    let mut send = connection(&g).await;
    assert_eq!(ask(&mut send, "GET", "/plain").await.2, "ok");
    g.signal("-TERM").await;
    let exited = g.process.wait_exit(Duration::from_secs(7)).await;
    let status = exited.expect("the gateway still runs 7 s after SIGTERM");
    assert!(status.success(), "{status}");
}

/// An upstream nobody listens on: 502 `upstream_unavailable` (nothing
/// reached it), RFC 9457, on a connection that stays open for the next.
#[tokio::test]
async fn an_upstream_that_is_down_is_a_502_on_a_kept_connection() {
    let yaml = format!(
        "upstream: http://127.0.0.1:{}\nstore: memory\n",
        free_port()
    );
    let g = gateway_with(&yaml, &["--workers", "1"]).await;
    let mut send = connection(&g).await;
    for method in ["GET", "HEAD", "GET"] {
        let (status, headers, body) = ask(&mut send, method, "/plain").await;
        assert_eq!(status, 502, "{method} {body}");
        assert_eq!(headers["content-type"], "application/problem+json");
        assert!(headers.contains_key("date"));
        if method == "HEAD" {
            // Its length, not its body (which the next answer would be
            // read as).
            assert_eq!(body, "");
            assert_ne!(headers["content-length"], "0");
        } else {
            assert!(body.contains("\"code\":\"upstream_unavailable\""), "{body}");
        }
    }
}

/// A target's fragment is not the upstream's: a request with one is
/// forwarded without it (by hyper's path, to which the lane leaves it).
#[tokio::test]
async fn a_fragment_is_not_forwarded() {
    let b = backend().await;
    let g = gateway_for(&b).await;
    let text = over_tcp(
        &g,
        b"GET /plain#\\x HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    let head = b.heads.lock().unwrap()[0].clone();
    assert!(head.starts_with("GET /plain HTTP/1.1\r\n"), "{head}");
}

/// A client that leaves while the upstream is still working: the upstream
/// request is given up and the access log says 499 `client_closed`, as on
/// hyper's path (the lane wrote the upstream's 200 for a client long gone).
/// A route's request names its route there, on the lane and on hyper's
/// path alike (its line had no route).
#[tokio::test]
async fn a_client_that_leaves_before_the_answer_is_logged_499() {
    let b = backend().await;
    let log = AccessLog::new();
    let yaml = format!(
        "access_log: {}\nupstream: http://127.0.0.1:{}\nstore: memory\nidentity:\n  ip: true\nroutes:\n  - match: POST /slow\n    guard: fingerprint\n",
        log.display(),
        b.port
    );
    let g = gateway_with(&yaml, &["--workers", "1"]).await;
    let mut s = connect(&g).await;
    s.write_all(b"GET /slow HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(s);
    let line = log_line(&log, "/slow").await;
    let entry: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(entry["status"], 499, "{line}");
    assert_eq!(entry["outcome"], "client_closed", "{line}");
    assert_eq!(entry["path"], "/slow", "{line}");
    assert!(entry["route"].is_null(), "{line}");
    // A route's request, its body with its head (the lane) and chunked
    // (hyper's path): each line names the route.
    let posts = [
        "POST /slow HTTP/1.1\r\nhost: a\r\ncontent-length: 2\r\n\r\nhi",
        "POST /slow HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n2\r\nho\r\n0\r\n\r\n",
    ];
    for (n, post) in posts.iter().enumerate() {
        let mut s = connect(&g).await;
        s.write_all(post.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(s);
        let lines = log_lines(&log, "\"method\":\"POST\"", n + 1).await;
        let entry: Value = serde_json::from_str(&lines[n]).unwrap();
        assert_eq!(entry["status"], 499, "{post}: {entry}");
        assert_eq!(entry["route"], "POST /slow", "{post}: {entry}");
    }
    // Served on: the next client is answered.
    let mut send = connection(&g).await;
    assert_eq!(ask(&mut send, "GET", "/plain").await.2, "ok");
}

/// A route's request whose body is in hand goes out by hand too: each
/// framing of the answer comes through whole on a fingerprint route, the
/// upstream connection kept but after the answer that ended with it, and
/// an idempotency route replays a chunked answer's body byte for byte. An
/// answer with two lengths is 504 there too.
#[tokio::test]
async fn a_routes_answer_comes_whole_in_every_framing_and_replays_byte_for_byte() {
    let b = backend().await;
    let yaml = format!(
        "upstream: http://127.0.0.1:{}\nstore: memory\nroutes:\n  - match: POST /pay/{{what}}\n    guard: idempotency\n  - match: POST /{{what}}\n    guard: fingerprint\n",
        b.port
    );
    let g = gateway_with(&yaml, &["--workers", "1"]).await;
    let c = Client::new();
    let post = |path: &str, body: &str| {
        c.post(url(&g, path))
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
    };
    let plain = post("/plain", "{\"n\":1}").await.unwrap();
    assert_eq!(plain.text().await.unwrap(), "ok");
    let streamed = post("/until-close", "{\"n\":2}").await.unwrap();
    assert_eq!(streamed.status(), 200);
    assert_eq!(streamed.text().await.unwrap(), "streamed to the end");
    let chunked = post("/chunked", "{\"n\":3}").await.unwrap();
    assert_eq!(chunked.text().await.unwrap(), "abcde");
    let hinted = post("/early-hints", "{\"n\":4}").await.unwrap();
    assert_eq!(hinted.status(), 200);
    assert_eq!(hinted.text().await.unwrap(), "ok");
    let (status, body) = code(post("/two-lengths", "{\"n\":5}").await.unwrap()).await;
    assert_eq!(status, 504, "{body}");
    assert!(body.contains("upstream_timeout"), "{body}");
    // The repeat of a fingerprint is refused before the upstream.
    assert_eq!(post("/plain", "{\"n\":1}").await.unwrap().status(), 409);

    let pay = |key: &'static str| {
        c.post(url(&g, "/pay/chunked"))
            .header("idempotency-key", key)
            .body("{}")
            .send()
    };
    let first = pay("k-1").await.unwrap();
    assert!(first.headers().get("idempotent-replayed").is_none());
    assert_eq!(first.text().await.unwrap(), "abcde");
    let again = pay("k-1").await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.text().await.unwrap(), "abcde");

    let heads = b.heads.lock().unwrap().clone();
    let paths: Vec<&str> = heads.iter().map(|h| h.split(' ').nth(1).unwrap()).collect();
    assert_eq!(
        paths,
        [
            "/plain",
            "/until-close",
            "/chunked",
            "/early-hints",
            "/two-lengths",
            "/pay/chunked"
        ]
    );
    // The body went with its length.
    assert!(
        heads[0]
            .to_ascii_lowercase()
            .contains("\r\ncontent-length: 7\r\n"),
        "{}",
        heads[0]
    );
    // One connection, one more after the answer that ended with its own
    // and one after the answer that could not be framed.
    assert_eq!(b.connections.load(Ordering::SeqCst), 3);
}

/// An upload whose body comes in two pieces (the second 200 ms after the
/// first) is not in hand: it streams by hyper's client, the piece already
/// taken put back in front, and reaches the backend whole (the backend
/// reads its 11 bytes, then answers 201).
#[tokio::test]
async fn an_upload_in_two_pieces_reaches_the_backend_whole() {
    let b = backend().await;
    let g = gateway_for(&b).await;
    let mut s = connect(&g).await;
    s.set_nodelay(true).unwrap();
    s.write_all(
        b"POST /upload HTTP/1.1\r\nhost: a\r\nconnection: close\r\ncontent-length: 11\r\n\r\nhello",
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.write_all(b" world").await.unwrap();
    let text = read_rest(&mut s).await;
    assert!(text.starts_with("HTTP/1.1 201 "), "{text}");
    assert!(text.ends_with("created"), "{text}");
}

/// A head still coming when the shutdown begins is read to its end and
/// answered (with `Connection: close`) before the gateway exits; hyper's
/// graceful shutdown closed the handed-over connection unanswered.
#[tokio::test]
async fn a_head_still_coming_at_the_shutdown_is_answered() {
    let b = backend().await;
    let mut g = stopping_at_once(&b).await;
    let mut s = connect(&g).await;
    s.write_all(b"GET /plain HTTP/1.1\r\nhost: a\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    g.signal("-TERM").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    s.write_all(b"\r\n").await.unwrap();
    let text = read_rest(&mut s).await;
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text:?}");
    assert!(text.ends_with("\r\n\r\nok"), "{text:?}");
    let exited = g.process.wait_exit(Duration::from_secs(10)).await;
    assert!(exited.is_some_and(|s| s.success()), "{exited:?}");
}

/// HTTP/2's preface after an HTTP/1.1 request on the same connection is
/// no request: the connection is closed after the first answer (it was
/// handed to hyper, which switched protocols mid-connection).
#[tokio::test]
async fn an_http2_preface_after_a_request_closes_the_connection() {
    let b = backend().await;
    let g = gateway_for(&b).await;
    let text = over_tcp(
        &g,
        b"GET /plain HTTP/1.1\r\nhost: a\r\n\r\nPRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text:?}");
    assert!(text.ends_with("\r\n\r\nok"), "{text:?}");
}

/// Bodiless requests the lane reads first, in the spellings that would
/// pass a guarded route by: a method not in upper case, an encoded slash
/// that decodes onto the route, the route in another case, are 400 and
/// never forwarded; the route's own spellings are the route's (guarded:
/// the second is a repeat, 409). The backend gets one request.
#[tokio::test]
async fn bodiless_spellings_of_a_guarded_route_never_pass_it_by() {
    let b = backend().await;
    let yaml = format!(
        "upstream: http://127.0.0.1:{}\nstore: memory\nroutes:\n  - match: DELETE /items/{{id}}\n    guard: fingerprint\n",
        b.port
    );
    let g = gateway_with(&yaml, &["--workers", "1"]).await;
    let g = &g;
    let ask = |line: &str| {
        let bytes = format!("{line} HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n");
        async move { over_tcp(g, bytes.as_bytes()).await }
    };
    for line in [
        "delete /items/1",
        "Delete /items/1",
        "DELETE /items%2F1",
        "DELETE /Items/1",
    ] {
        let text = ask(line).await;
        assert!(text.starts_with("HTTP/1.1 400 "), "{line}: {text}");
        assert!(text.contains("invalid_request"), "{line}: {text}");
    }
    let first = ask("DELETE //items/1").await;
    assert!(first.starts_with("HTTP/1.1 200 "), "{first}");
    let repeat = ask("DELETE /items/1/").await;
    assert!(repeat.starts_with("HTTP/1.1 409 "), "{repeat}");
    let heads = b.heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert!(
        heads[0].starts_with("DELETE /items/1 HTTP/1.1\r\n"),
        "{heads:?}"
    );
}

/// A guarded route's requests with bodies, pipelined on one connection
/// between unguarded ones, are read and answered on the lane
/// (`serve/routed.rs`) in order: the fingerprint route's answer with its
/// length, one that ended with the upstream's connection chunked for the
/// client, a repeat refused 409 before the backend, a `HEAD` without a
/// body, the upstream's own reason phrase; each with the gateway's
/// request id and a `Date`; the last,
/// `Connection: close`, closes the connection after its answer. The
/// backend reads each body whole.
#[tokio::test]
async fn a_routes_pipelined_requests_are_answered_in_order_on_the_lane() {
    let b = backend().await;
    let log = AccessLog::new();
    let yaml = format!(
        "access_log: {}\nupstream: http://127.0.0.1:{}\nstore: memory\nroutes:\n  - match: POST /{{what}}\n    guard: fingerprint\n",
        log.display(),
        b.port
    );
    let g = gateway_with(&yaml, &["--workers", "1"]).await;
    let post = |path: &str, body: &str, last: bool| {
        format!(
            "POST {path} HTTP/1.1\r\nhost: a\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{}\r\n{body}",
            body.len(),
            if last { "connection: close\r\n" } else { "" }
        )
    };
    let pipelined = [
        post("/plain", "{\"n\":1}", false),
        "GET /plain HTTP/1.1\r\nhost: a\r\n\r\n".to_owned(),
        post("/plain", "{\"n\":1}", false),
        "HEAD /plain HTTP/1.1\r\nhost: a\r\n\r\n".to_owned(),
        post("/reason", "{\"n\":3}", false),
        post("/until-close", "{\"n\":2}", true),
    ]
    .concat();
    let text = over_tcp(&g, pipelined.as_bytes()).await;
    let answers: Vec<&str> = text.split("HTTP/1.1 ").skip(1).collect();
    assert_eq!(answers.len(), 6, "{text}");
    assert!(answers[0].starts_with("200 OK\r\n"), "{text}");
    assert!(answers[0].contains("\r\ncontent-length: 2\r\n"), "{text}");
    assert!(answers[0].ends_with("\r\n\r\nok"), "{text}");
    assert!(answers[1].ends_with("\r\n\r\nok"), "{text}");
    assert!(answers[2].starts_with("409 Conflict\r\n"), "{text}");
    assert!(answers[2].contains("duplicate_submission"), "{text}");
    assert!(answers[3].starts_with("200 OK\r\n"), "{text}");
    assert!(
        answers[3].ends_with("\r\n\r\n"),
        "a HEAD's answer has no body: {text}"
    );
    // The upstream's own reason phrase.
    assert!(answers[4].starts_with("200 Fine Thanks\r\n"), "{text}");
    let last = answers[5];
    assert!(last.starts_with("200 OK\r\n"), "{text}");
    assert!(
        last.contains("\r\ntransfer-encoding: chunked\r\n"),
        "{text}"
    );
    assert!(last.contains("\r\nconnection: close\r\n"), "{text}");
    assert!(
        last.ends_with("\r\n\r\n13\r\nstreamed to the end\r\n0\r\n\r\n"),
        "{text}"
    );
    for a in &answers {
        let head = a.to_ascii_lowercase();
        assert!(head.contains("\r\nx-request-id: "), "{a}");
        assert!(head.contains("\r\ndate: "), "{a}");
    }
    let heads = b.heads.lock().unwrap().clone();
    let lines: Vec<&str> = heads.iter().map(|h| h.lines().next().unwrap()).collect();
    assert_eq!(
        lines,
        [
            "POST /plain HTTP/1.1",
            "GET /plain HTTP/1.1",
            "HEAD /plain HTTP/1.1",
            "POST /reason HTTP/1.1",
            "POST /until-close HTTP/1.1"
        ]
    );
    assert!(heads[0].contains("content-length: 7\r\n"), "{}", heads[0]);
    // The route's lines name it; the repeat's says why it was refused.
    let line = log_line(&log, "\"status\":409").await;
    let entry: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(entry["path"], "/plain", "{line}");
    assert_eq!(entry["outcome"], "duplicate", "{line}");
}

/// A guarded route's body that does not come with its head (hyper's
/// path reads it, as the route asks): one sent in two pieces is read
/// whole and forwarded once; one that stops half-way is answered 400
/// `invalid_request` after `body_timeout` (with the request id a trusted
/// proxy gave, as `dispatch` keeps it; named and counted under its route)
/// and never forwarded; a client that leaves half-way has its line, a
/// body that broke off (400 `invalid_request`, as the README says of any
/// such body; the lane, which read these bodies first, logged 499), under
/// its route, and nothing forwarded.
#[tokio::test]
async fn a_routes_body_in_pieces_stalled_or_abandoned() {
    let b = backend().await;
    let log = AccessLog::new();
    let yaml = format!(
        "access_log: {}\nupstream: http://127.0.0.1:{}\nstore: memory\nidentity:\n  ip: true\n  trusted_proxies: [127.0.0.0/8]\nlimits:\n  body_timeout: 1s\nroutes:\n  - match: POST /{{what}}\n    guard: fingerprint\n",
        log.display(),
        b.port
    );
    let g = gateway_with(&yaml, &["--workers", "1"]).await;
    let head =
        "POST /upload HTTP/1.1\r\nhost: a\r\nconnection: close\r\ncontent-length: 11\r\n\r\n";

    let mut s = connect(&g).await;
    s.set_nodelay(true).unwrap();
    s.write_all(format!("{head}hello").as_bytes())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.write_all(b" world").await.unwrap();
    let text = read_rest(&mut s).await;
    assert!(text.starts_with("HTTP/1.1 201 "), "{text}");
    assert!(text.ends_with("created"), "{text}");

    let mut stalled = connect(&g).await;
    stalled
        .write_all(
            format!("{head}hel")
                .replace("/upload", "/stalled")
                .replace("host: a\r\n", "host: a\r\nx-request-id: edge-7\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    let text = read_rest(&mut stalled).await;
    assert!(text.starts_with("HTTP/1.1 400 "), "{text}");
    assert!(text.contains("invalid_request"), "{text}");
    // The id a trusted proxy gave, on the answer and its line.
    assert!(text.contains("\r\nx-request-id: edge-7\r\n"), "{text}");
    let line = log_line(&log, "/stalled").await;
    assert!(line.contains("\"status\":400"), "{line}");
    assert!(line.contains("\"request_id\":\"edge-7\""), "{line}");
    // Named and counted under its route, as hyper's path does.
    let entry: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(entry["route"], "POST /{what}", "{line}");
    let text = scrape(&g).await;
    assert_eq!(
        value(
            &text,
            "norepeat_gateway_invalid_total",
            r#"route="POST /{what}",code="invalid_request""#
        ),
        1,
        "{text}"
    );

    let mut left = connect(&g).await;
    left.write_all(format!("{head}hel").replace("/upload", "/left").as_bytes())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(left);
    let line = log_line(&log, "/left").await;
    let entry: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(entry["status"], 400, "{line}");
    assert_eq!(entry["outcome"], "invalid_request", "{line}");
    assert_eq!(entry["route"], "POST /{what}", "{line}");

    let heads = b.heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert!(heads[0].starts_with("POST /upload "), "{heads:?}");
}

/// An idle upstream connection that the backend closes (its keep-alive
/// timeout) is closed by the gateway too, within a sweep of its idle
/// connections, with no next request: before, it waited in `CLOSE_WAIT`
/// until one came. Both the lane's connections and a route's (the upstream
/// call by hand) are swept: the backend reads the gateway's end of each
/// within 5 s of closing its own.
#[tokio::test]
async fn an_idle_upstream_connection_the_backend_closes_is_closed_here_too() {
    // The backend's keep-alive timeout: its end closes after the answer.
    let (port, mut closed) =
        watching_backend(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", true).await;
    let yaml = format!(
        "upstream: http://127.0.0.1:{port}\nstore: memory\nroutes:\n  - match: POST /orders\n    guard: fingerprint\n"
    );
    let g = gateway_with(&yaml, &["--workers", "1"]).await;
    let text = over_tcp(
        &g,
        b"GET /plain HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(text.ends_with("\r\n\r\nok"), "{text}");
    assert!(
        closed.recv().await.unwrap(),
        "the lane's idle connection stayed open after the backend closed its end"
    );
    let text = over_tcp(
        &g,
        b"POST /orders HTTP/1.1\r\nhost: a\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}",
    )
    .await;
    assert!(text.ends_with("\r\n\r\nok"), "{text}");
    assert!(
        closed.recv().await.unwrap(),
        "a route's idle connection stayed open after the backend closed its end"
    );
}

/// A client that leaves while its answer's body is quiet (a stream, a long
/// poll) ends that answer: the gateway closes the upstream's connection at
/// once, on the lane's forwarding (a `GET` no route takes) and on a
/// route's request read on the lane (a fingerprint `POST`). Before, the
/// upstream connection stayed open as long as the backend kept it.
#[tokio::test]
async fn a_client_that_leaves_a_quiet_stream_closes_the_upstream_connection() {
    // A stream: its first piece, then nothing.
    let (port, mut closed) = watching_backend(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n",
        false,
    )
    .await;
    let yaml = format!(
        "upstream: http://127.0.0.1:{port}\nstore: memory\nroutes:\n  - match: POST /orders\n    guard: fingerprint\n"
    );
    let g = gateway_with(&yaml, &["--workers", "1"]).await;
    let requests: [(&[u8], &str); 2] = [
        (
            b"GET /events HTTP/1.1\r\nhost: a\r\n\r\n",
            "the lane's forwarding",
        ),
        (
            b"POST /orders HTTP/1.1\r\nhost: a\r\ncontent-length: 2\r\n\r\n{}",
            "a route's request",
        ),
    ];
    for (request, way) in requests {
        let mut s = connect(&g).await;
        s.write_all(request).await.unwrap();
        let mut got = Vec::new();
        let mut piece = [0u8; 256];
        while !got.ends_with(b"abc\r\n") {
            let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut piece))
                .await
                .expect("the stream's first piece")
                .unwrap();
            assert!(n > 0, "{}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&piece[..n]);
        }
        drop(s);
        assert!(
            closed.recv().await.unwrap(),
            "{way}: the upstream connection stayed open after the client left"
        );
    }
}

/// Requests pipelined and then the client's side closed (a half-close):
/// the request in flight is answered, as hyper's server answers it, not
/// dropped as though the client had left (the lane read the end behind
/// the next request's bytes and gave up the first, which the backend may
/// already have run).
#[tokio::test]
async fn pipelined_requests_then_a_half_close_get_the_answer_in_flight() {
    let b = backend().await;
    let yaml = format!(
        "upstream: http://127.0.0.1:{}\nstore: memory\nroutes:\n  - match: POST /{{what}}\n    guard: fingerprint\n",
        b.port
    );
    let g = gateway_with(&yaml, &["--workers", "1"]).await;
    let post = |n: u32| {
        format!("POST /slow HTTP/1.1\r\nhost: a\r\ncontent-length: 7\r\n\r\n{{\"n\":{n}}}")
    };
    let mut s = connect(&g).await;
    s.write_all(format!("{}{}", post(1), post(2)).as_bytes())
        .await
        .unwrap();
    s.shutdown().await.unwrap();
    let text = read_rest(&mut s).await;
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text:?}");
    assert!(text.contains("\r\n\r\nok"), "{text:?}");
}

/// A body longer than its route's `max_request_body` is refused from its
/// declared length, 413 at once, without waiting for it (the lane read it
/// first, so a client that sent the head alone waited for `body_timeout`);
/// nothing reaches the backend.
#[tokio::test]
async fn a_body_over_the_routes_limit_is_refused_from_its_length() {
    let b = backend().await;
    let yaml = format!(
        "upstream: http://127.0.0.1:{}\nstore: memory\nroutes:\n  - match: POST /orders\n    guard: fingerprint\n    max_request_body: 1KiB\n",
        b.port
    );
    let g = gateway_with(&yaml, &["--workers", "1"]).await;
    let mut s = connect(&g).await;
    s.write_all(b"POST /orders HTTP/1.1\r\nhost: a\r\ncontent-length: 5000\r\n\r\n{")
        .await
        .unwrap();
    let mut head = [0u8; 12];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut head))
        .await
        .expect("an answer before the body came")
        .unwrap();
    assert_eq!(&head, b"HTTP/1.1 413");
    assert!(b.heads.lock().unwrap().is_empty());
}

/// What a route refuses from a request's head alone (no caller, the rate
/// spent) is refused at once, its body never waited for: as on hyper's
/// path, where the rate limit and the guard's identity come before the
/// body is read. (The lane read a guarded route's body first, so a client
/// that declared one and sent none waited `body_timeout` for a 400, and an
/// unauthenticated client made the gateway hold its body.)
#[tokio::test]
async fn a_refusal_from_the_head_does_not_wait_for_the_body() {
    let b = backend().await;
    let yaml = format!(
        "upstream: http://127.0.0.1:{}\nstore: memory\nidentity:\n  header: X-User-Id\n  required: true\nlimits:\n  body_timeout: 60s\nroutes:\n  - match: POST /upload\n    rate_limit: {{ rate: 1/m, by: identity }}\n    guard: fingerprint\n",
        b.port
    );
    let g = gateway_with(&yaml, &["--workers", "1"]).await;
    let head_only = |user: &str| {
        format!("POST /upload HTTP/1.1\r\nhost: a\r\n{user}content-length: 10\r\n\r\n")
    };
    let status_of = |head: String| {
        let g = &g;
        async move {
            let mut s = connect(g).await;
            s.write_all(head.as_bytes()).await.unwrap();
            let mut line = [0u8; 12];
            tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut line))
                .await
                .expect("answered without the body")
                .unwrap();
            String::from_utf8_lossy(&line).into_owned()
        }
    };
    // No caller: 401 from the head.
    assert_eq!(status_of(head_only("")).await, "HTTP/1.1 401");
    // The rate spent by a whole request: 429 from the head.
    let whole = format!("{}0123456789", head_only("x-user-id: u\r\n"));
    assert_eq!(status_of(whole).await, "HTTP/1.1 201");
    assert_eq!(
        status_of(head_only("x-user-id: u\r\n")).await,
        "HTTP/1.1 429"
    );
    assert_eq!(b.heads.lock().unwrap().len(), 1);
}
