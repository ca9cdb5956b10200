//! The gateway's own upstream connections (issue 39: hyper-util's pooled
//! client replaced by one per worker): an idle connection is used again,
//! one the backend closed is not, a request is never sent twice, and an
//! answer's body is passed on whole before its connection goes back.
//! The backend is a raw TCP server in the test, so that what it sees
//! (connections, requests) and how it closes them are the test's.

use crate::common::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How the test's backend treats a connection after each request.
#[derive(Clone, Copy)]
enum Mode {
    /// Answers `200 ok` and waits for the next request.
    KeepAlive,
    /// Answers with `Connection: close` and closes.
    CloseAfterEach,
    /// Answers, then closes once the connection is idle this long.
    IdleClose(Duration),
    /// Reads the request and closes without a word: the backend died
    /// half-way (the request may have had its effect).
    Vanish,
    /// Answers a body of this many bytes, in chunks.
    Chunked(usize),
    /// Answers a `POST` 413 as soon as its head is read (the body unread,
    /// the connection held open), a `GET` `200 ok`.
    EarlyAnswer,
}

/// The backend: where it listens, the connections it accepted and the
/// requests it read.
struct Backend {
    port: u16,
    connections: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
}

async fn backend_in(mode: Mode) -> Backend {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let connections = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let (c, r) = (Arc::clone(&connections), Arc::clone(&requests));
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            c.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(s, mode, Arc::clone(&r)));
        }
    });
    Backend {
        port,
        connections,
        requests,
    }
}

/// Reads one request head (its body, if any, is left unread): `None` at
/// the connection's end, else whether it is a `POST`.
async fn read_head(s: &mut tokio::net::TcpStream) -> Option<bool> {
    Some(read_head_bytes(s).await?.starts_with(b"POST"))
}

async fn serve(mut s: tokio::net::TcpStream, mode: Mode, requests: Arc<AtomicUsize>) {
    loop {
        let next = match mode {
            Mode::IdleClose(idle) => tokio::time::timeout(idle, read_head(&mut s))
                .await
                .unwrap_or(None),
            _ => read_head(&mut s).await,
        };
        let Some(posted) = next else {
            return;
        };
        requests.fetch_add(1, Ordering::SeqCst);
        if matches!(mode, Mode::EarlyAnswer) && posted {
            let _ = s
                .write_all(b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 0\r\n\r\n")
                .await;
            tokio::time::sleep(Duration::from_secs(60)).await;
            return;
        }
        let answer = match mode {
            Mode::KeepAlive | Mode::IdleClose(_) | Mode::EarlyAnswer => {
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec()
            }
            Mode::CloseAfterEach => {
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok".to_vec()
            }
            Mode::Vanish => return,
            Mode::Chunked(n) => {
                let mut a = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
                for piece in vec![b'x'; n].chunks(4096) {
                    a.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                    a.extend_from_slice(piece);
                    a.extend_from_slice(b"\r\n");
                }
                a.extend_from_slice(b"0\r\n\r\n");
                a
            }
        };
        if s.write_all(&answer).await.is_err() {
            return;
        }
        if matches!(mode, Mode::CloseAfterEach) {
            let _ = s.shutdown().await;
            return;
        }
    }
}

/// A gateway on one worker passing everything through to `b`.
async fn gateway_before(b: &Backend) -> Process {
    let yaml = format!("upstream: http://127.0.0.1:{}\nstore: memory\n", b.port);
    gateway_with(&yaml, &["--workers", "1"]).await
}

async fn get(client: &Client, g: &Process) -> (StatusCode, String) {
    let res = client.get(url(g, "/orders")).send().await.unwrap();
    (res.status(), res.text().await.unwrap())
}

/// Twenty requests one after the other take one upstream connection
/// (failed with the connection never given back: twenty), and an answer
/// of 1 MiB in chunks comes whole, its connection used again after it.
#[tokio::test]
async fn an_idle_upstream_connection_is_used_again() {
    let b = backend_in(Mode::KeepAlive).await;
    let g = gateway_before(&b).await;
    let client = Client::new();
    for _ in 0..20 {
        assert_eq!(get(&client, &g).await, (StatusCode::OK, "ok".to_owned()));
    }
    assert_eq!(b.requests.load(Ordering::SeqCst), 20);
    assert_eq!(b.connections.load(Ordering::SeqCst), 1);

    let big = backend_in(Mode::Chunked(1 << 20)).await;
    let g = gateway_before(&big).await;
    for _ in 0..3 {
        let (status, body) = get(&client, &g).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body.len(), 1 << 20);
    }
    assert_eq!(big.connections.load(Ordering::SeqCst), 1);
}

/// A backend that closes its connections, after each answer or once idle:
/// every request is answered (none meets a closed connection as a 502 or
/// a 504), each on a new connection.
#[tokio::test]
async fn a_connection_the_backend_closed_is_not_used_again() {
    let client = Client::new();
    let closing = backend_in(Mode::CloseAfterEach).await;
    let g = gateway_before(&closing).await;
    for _ in 0..5 {
        assert_eq!(get(&client, &g).await, (StatusCode::OK, "ok".to_owned()));
    }
    assert_eq!(closing.connections.load(Ordering::SeqCst), 5);

    let idle = backend_in(Mode::IdleClose(Duration::from_millis(50))).await;
    let g = gateway_before(&idle).await;
    for _ in 0..4 {
        assert_eq!(get(&client, &g).await, (StatusCode::OK, "ok".to_owned()));
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert_eq!(idle.requests.load(Ordering::SeqCst), 4);
    assert_eq!(idle.connections.load(Ordering::SeqCst), 4);
}

/// A backend that reads a request and dies without answering: the client
/// gets 504 `upstream_timeout` (the outcome is unknown) and the request
/// reached the backend once: a request that was sent is never sent again
/// on another connection, whatever its method.
#[tokio::test]
async fn a_request_the_backend_read_is_never_sent_again() {
    let b = backend_in(Mode::Vanish).await;
    let g = gateway_before(&b).await;
    let res = Client::new()
        .post(url(&g, "/payments"))
        .body("{}")
        .send()
        .await
        .unwrap();
    let (status, body) = code(res).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    assert!(body.contains("upstream_timeout"), "{body}");
    assert_eq!(b.requests.load(Ordering::SeqCst), 1);
    assert_eq!(b.connections.load(Ordering::SeqCst), 1);
}

/// A backend that answers an upload before reading it (413) while the
/// client is still sending: that connection is busy until the upload
/// ends, so it is not given to the next request. Another client's `GET`
/// is answered at once on a new connection (it waited for the stalled
/// upload's `body_timeout`, 30 s, when the connection went back to the
/// idle ones as its answer ended).
#[tokio::test]
async fn a_connection_still_sending_an_upload_is_not_given_to_the_next_request() {
    let b = backend_in(Mode::EarlyAnswer).await;
    let g = gateway_before(&b).await;
    let mut upload = connect(&g).await;
    upload
        .write_all(b"POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n0123456789")
        .await
        .unwrap();
    let mut head = vec![0u8; 12];
    upload.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 413");
    // The upload stalls, 90 bytes short, its connection open.
    let answered = tokio::time::timeout(Duration::from_secs(10), get(&Client::new(), &g)).await;
    assert_eq!(
        answered.expect("the GET waited for the stalled upload's connection"),
        (StatusCode::OK, "ok".to_owned())
    );
    assert_eq!(b.connections.load(Ordering::SeqCst), 2);
    drop(upload);
}

/// A reload that changes the file's `upstream`: the next requests go to
/// the new backend, never over a connection kept idle to the old one
/// (the pass-through's connections are the reloaded routes', made anew).
#[tokio::test]
async fn a_reload_to_another_upstream_leaves_the_old_ones_connections() {
    let old = backend_in(Mode::KeepAlive).await;
    let new = backend_in(Mode::KeepAlive).await;
    let g = gateway_before(&old).await;
    let client = Client::new();
    assert_eq!(get(&client, &g).await.0, StatusCode::OK);
    let file = g.file.as_ref().expect("the gateway's file");
    std::fs::write(
        file,
        format!("upstream: http://127.0.0.1:{}\nstore: memory\n", new.port),
    )
    .unwrap();
    g.signal("-HUP").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while new.requests.load(Ordering::SeqCst) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never reloaded");
        assert_eq!(get(&client, &g).await.0, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = old.requests.load(Ordering::SeqCst);
    for _ in 0..5 {
        assert_eq!(get(&client, &g).await.0, StatusCode::OK);
    }
    assert_eq!(
        old.requests.load(Ordering::SeqCst),
        before,
        "the old backend got more"
    );
    assert_eq!(new.connections.load(Ordering::SeqCst), 1);
}
