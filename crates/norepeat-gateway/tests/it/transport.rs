// Over 400 lines: TLS, HTTP/2 and their reloads through the binary, sharing the certificates made here.
//! The gateway's transport, against the real binary and the Python
//! backend (`tests/backend.py`): TLS termination from certificate files
//! made here (rcgen), re-read when they change; HTTP/2 by ALPN and in
//! cleartext with prior knowledge; split `cookie` fields joined; an
//! `Upgrade` spliced through to the backend (refused on a guarded
//! route); an `https://` upstream checked against `upstream_ca`; a silent
//! TLS client cut at `header_timeout`; `check` on bad certificate files.

// The helpers below are test code too: a failure is a panic with its place.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use norepeat_testkit::ShopProcess;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// A folder of its own for one test's files, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new() -> Dir {
        let dir = std::env::temp_dir().join(format!(
            "norepeat-gw-transport-{}-{}",
            std::process::id(),
            norepeat_testkit::free_port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// Writes `text` to `name` beside the old file, then renames it into
    /// place (as an operator replaces a certificate).
    fn put(&self, name: &str, text: &str) -> PathBuf {
        let tmp = self.path(&format!(".{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        let path = self.path(name);
        std::fs::rename(&tmp, &path).unwrap();
        path
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A self-signed certificate for `localhost` and 127.0.0.1: its PEM, its
/// key's PEM, and its DER.
struct Cert {
    pem: String,
    key: String,
    der: CertificateDer<'static>,
}

fn cert() -> Cert {
    let made =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .unwrap();
    Cert {
        pem: made.cert.pem(),
        key: made.signing_key.serialize_pem(),
        der: made.cert.der().clone(),
    }
}

/// The gateway process on a free port (killed when dropped).
struct Gateway {
    _child: Child,
    port: u16,
}

/// Starts the gateway on `dir`'s `gateway.yaml` (written from `yaml`) and
/// waits for its `listening on` line.
async fn gateway(dir: &Dir, yaml: &str) -> Gateway {
    let file = dir.put("gateway.yaml", yaml);
    let mut child = Command::new(env!("CARGO_BIN_EXE_norepeat-gateway"))
        .args([
            "--config",
            &file.to_string_lossy(),
            "--listen",
            "127.0.0.1:0",
        ])
        .env_clear()
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("listening on ") {
                return line;
            }
        }
        panic!("the gateway ended without listening");
    })
    .await
    .expect("the gateway listens within 60 s");
    let port = line.rsplit(':').next().unwrap().trim().parse().unwrap();
    // Keep reading its stdout, so it never blocks writing.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Gateway {
        _child: child,
        port,
    }
}

async fn backend() -> (ShopProcess, u16) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/backend.py");
    let p = ShopProcess::spawn(
        "python3",
        vec![script.to_owned(), "0".to_owned()],
        Vec::new(),
    )
    .await;
    let port = p.base_url().rsplit(':').next().unwrap().parse().unwrap();
    (p, port)
}

/// A TLS client trusting `roots`, offering `alpn`.
fn tls_client(roots: &[&CertificateDer<'static>], alpn: &[&[u8]]) -> tokio_rustls::TlsConnector {
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store.add((*r).clone()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

type Tls = tokio_rustls::client::TlsStream<TcpStream>;

async fn tls_connect(port: u16, client: &tokio_rustls::TlsConnector) -> Tls {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    client
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap()
}

/// `GET path` over HTTP/2 on `io`, with these headers (repeated names
/// kept apart, as an HTTP/2 client sends split cookies): status and body.
async fn h2_get<I>(io: I, authority: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut req = http::Request::get(format!("{authority}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let res = send
        .send_request(req.body(Empty::<Bytes>::new()).unwrap())
        .await
        .unwrap();
    let status = res.status().as_u16();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// `GET path` over HTTP/1.1 on `io`: status and body.
async fn h1_get<I>(io: I, path: &str) -> (u16, String)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get(path)
        .header("host", "localhost")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let res = send.send_request(req).await.unwrap();
    let status = res.status().as_u16();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

fn tls_yaml(dir: &Dir, c: &Cert, upstream: u16, rest: &str) -> String {
    let cert = dir.put("cert.pem", &c.pem);
    let key = dir.put("key.pem", &c.key);
    format!(
        "upstream: http://127.0.0.1:{upstream}\ntls: {{ cert: {}, key: {} }}\n{rest}",
        cert.display(),
        key.display()
    )
}

#[tokio::test]
async fn tls_offers_h2_by_alpn_and_http1_and_joins_split_cookies() {
    let dir = Dir::new();
    let (_b, bport) = backend().await;
    let c = cert();
    let g = gateway(&dir, &tls_yaml(&dir, &c, bport, "")).await;

    let h2 = tls_connect(g.port, &tls_client(&[&c.der], &[b"h2", b"http/1.1"])).await;
    assert_eq!(h2.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (status, body) = h2_get(
        h2,
        "https://localhost",
        "/echo",
        &[("cookie", "sid=1"), ("cookie", "_ga=2")],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let seen: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(seen["cookie"], "sid=1; _ga=2", "{seen}");
    assert_eq!(seen["x-forwarded-proto"], "https", "{seen}");
    assert_eq!(seen["host"], "localhost", "{seen}");

    let h1 = tls_connect(g.port, &tls_client(&[&c.der], &[b"http/1.1"])).await;
    assert_eq!(h1.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let (status, body) = h1_get(h1, "/echo").await;
    assert_eq!(status, 200, "{body}");
}

/// Cleartext HTTP/2 with prior knowledge, and split cookies joined before
/// the identity reads them: a caller named by its `Cookie` is the same
/// caller over HTTP/2 (before, the two fields were two values: 401).
#[tokio::test]
async fn h2c_prior_knowledge_is_served_and_a_split_cookie_names_the_caller() {
    let dir = Dir::new();
    let (_b, bport) = backend().await;
    let g = gateway(
        &dir,
        &format!(
            "upstream: http://127.0.0.1:{bport}\nidentity: {{ header: Cookie, required: true }}\nroutes:\n  - match: POST /orders\n    guard: fingerprint\n  - match: GET /echo\n    rate_limit: {{ rate: 100/s }}\n"
        ),
    )
    .await;
    let tcp = TcpStream::connect(("127.0.0.1", g.port)).await.unwrap();
    let (status, body) = h2_get(
        tcp,
        "http://localhost",
        "/echo",
        &[("cookie", "sid=1"), ("cookie", "_ga=2")],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let seen: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(seen["cookie"], "sid=1; _ga=2", "{seen}");
    assert_eq!(seen["x-forwarded-proto"], "http", "{seen}");
}

/// HTTP/2's extended CONNECT (RFC 8441) is not offered: a browser then
/// opens its WebSockets over HTTP/1.1, which the gateway splices through
/// (an extended CONNECT would reach the HTTP/1.1 upstream as `CONNECT
/// /path`, which no backend takes for a WebSocket).
#[tokio::test]
async fn h2_does_not_offer_websockets_over_extended_connect() {
    let dir = Dir::new();
    let (_b, bport) = backend().await;
    let g = gateway(&dir, &format!("upstream: http://127.0.0.1:{bport}\n")).await;
    let tcp = TcpStream::connect(("127.0.0.1", g.port)).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    // A first request: the server's settings have come once it is answered.
    let first = http::Request::get("http://localhost/echo")
        .body(Empty::<Bytes>::new())
        .unwrap();
    assert_eq!(send.send_request(first).await.unwrap().status(), 200);
    let mut connect = http::Request::connect("http://localhost/upgrade")
        .body(Empty::<Bytes>::new())
        .unwrap();
    connect
        .extensions_mut()
        .insert(hyper::ext::Protocol::from_static("websocket"));
    let sent = send.send_request(connect).await;
    assert!(
        sent.is_err(),
        "an extended CONNECT was let through: {sent:?}"
    );
}

/// An idle HTTP/2 connection's pings are not a request head: the
/// connection lives past `header_timeout` while idle, and is closed
/// `idle_timeout` after its last stream, pings or not (before, the first
/// ping after a stream started a head, cut at `header_timeout`).
#[tokio::test]
async fn an_idle_h2_connection_is_held_to_the_idle_timeout_not_the_header_timeout() {
    let dir = Dir::new();
    let (_b, bport) = backend().await;
    let g = gateway(
        &dir,
        &format!(
            "upstream: http://127.0.0.1:{bport}\nlimits: {{ header_timeout: 1s, idle_timeout: 4s }}\n"
        ),
    )
    .await;
    let tcp = TcpStream::connect(("127.0.0.1", g.port)).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .timer(hyper_util::rt::TokioTimer::new())
        .keep_alive_interval(Duration::from_millis(200))
        .keep_alive_while_idle(true)
        .handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let get = || {
        http::Request::get("http://localhost/echo")
            .body(Empty::<Bytes>::new())
            .unwrap()
    };
    assert_eq!(send.send_request(get()).await.unwrap().status(), 200);
    // Idle, pinging, past header_timeout (not idle_timeout).
    tokio::time::sleep(Duration::from_millis(1800)).await;
    assert_eq!(send.send_request(get()).await.unwrap().status(), 200);
    // Then closed once idle_timeout has passed, pings or not.
    tokio::time::timeout(Duration::from_secs(30), conn)
        .await
        .expect("an idle HTTP/2 connection is closed after idle_timeout")
        .unwrap()
        .ok();
}

/// Writes `head` on a new connection to `port`; the connection and the
/// answer's head.
async fn raw_head(port: u16, head: &str) -> (TcpStream, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(30), s.read(&mut byte))
            .await
            .expect("an answer within 30 s")
            .unwrap();
        assert!(
            n > 0,
            "closed before the head: {}",
            String::from_utf8_lossy(&got)
        );
        got.push(byte[0]);
    }
    (s, String::from_utf8_lossy(&got).into_owned())
}

async fn echoed(s: &mut TcpStream, what: &[u8]) {
    s.write_all(what).await.unwrap();
    let mut back = vec![0u8; what.len()];
    tokio::time::timeout(Duration::from_secs(30), s.read_exact(&mut back))
        .await
        .expect("the echo within 30 s")
        .expect("the upgraded connection stays open");
    assert_eq!(back, what);
}

#[tokio::test]
async fn an_upgrade_passes_through_and_lives_while_bytes_flow_and_a_guarded_route_refuses_one() {
    let dir = Dir::new();
    let (_b, bport) = backend().await;
    let g = gateway(
        &dir,
        &format!(
            "upstream: http://127.0.0.1:{bport}\nlimits: {{ header_timeout: 1s, idle_timeout: 3s }}\nroutes:\n  - match: POST /orders\n    guard: token\n  - match: GET /routed/{{*rest}}\n    upstream: http://127.0.0.1:{bport}\n"
        ),
    )
    .await;
    let (mut s, head) = raw_head(
        g.port,
        "GET /upgrade HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("upgrade: websocket"),
        "{head}"
    );
    echoed(&mut s, b"hello").await;
    // A pause past header_timeout (but not idle_timeout): an upgraded
    // connection is not a request head waiting (it was cut here before).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    echoed(&mut s, b"again").await;
    // Silent both ways past idle_timeout: closed.
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut rest))
        .await
        .expect("a silent upgraded connection is closed after idle_timeout");
    assert!(closed.is_err() || rest.is_empty(), "{rest:?}");

    // Through a route that only routes, too.
    let (mut s, head) = raw_head(
        g.port,
        "GET /routed/upgrade HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    echoed(&mut s, b"routed").await;
    drop(s);

    // A guarded route: 400 invalid_request, nothing switched.
    let (mut s, head) = raw_head(
        g.port,
        "POST /orders HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nContent-Length: 0\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    let mut body = vec![0u8; 2048];
    let n = s.read(&mut body).await.unwrap();
    let body = String::from_utf8_lossy(&body[..n]);
    assert!(body.contains("invalid_request"), "{body}");
}

/// An upstream of our own over TLS with `c`'s certificate, answering
/// every request `200 secure`.
async fn https_upstream(c: &Cert) -> u16 {
    let key =
        <rustls::pki_types::PrivateKeyDer<'static> as PemObject>::from_pem_slice(c.key.as_bytes())
            .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![c.der.clone()], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(
                        http_body_util::Full::new(Bytes::from_static(b"secure")),
                    ))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    port
}

#[tokio::test]
async fn an_https_upstream_is_checked_against_upstream_ca() {
    let c = cert();
    let up = https_upstream(&c).await;
    let dir = Dir::new();
    let ca = dir.put("ca.pem", &c.pem);
    let g = gateway(
        &dir,
        &format!(
            "upstream: https://localhost:{up}\nupstream_ca: {}\n",
            ca.display()
        ),
    )
    .await;
    let res = reqwest::get(format!("http://127.0.0.1:{}/x", g.port))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.text().await.unwrap(), "secure");

    // The system's roots do not know this certificate: nothing reached
    // the upstream, 502.
    let other = Dir::new();
    let g = gateway(&other, &format!("upstream: https://localhost:{up}\n")).await;
    let res = reqwest::get(format!("http://127.0.0.1:{}/x", g.port))
        .await
        .unwrap();
    assert_eq!(res.status(), 502);
    assert!(res.text().await.unwrap().contains("upstream_unavailable"));
}

#[tokio::test]
async fn a_replaced_certificate_is_served_to_new_connections() {
    let dir = Dir::new();
    let (_b, bport) = backend().await;
    let (a, b) = (cert(), cert());
    let g = gateway(&dir, &tls_yaml(&dir, &a, bport, "")).await;
    let client = tls_client(&[&a.der, &b.der], &[b"http/1.1"]);
    let served = |s: &Tls| s.get_ref().1.peer_certificates().unwrap()[0].clone();
    let first = tls_connect(g.port, &client).await;
    assert_eq!(served(&first), a.der);

    // The key first, then the certificate: between the two the pair does
    // not match, and the old one stays.
    dir.put("key.pem", &b.key);
    dir.put("cert.pem", &b.pem);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let s = tls_connect(g.port, &client).await;
        if served(&s) == b.der {
            // A connection made then still serves.
            let (status, _) = h1_get(s, "/echo").await;
            assert_eq!(status, 200);
            break;
        }
        assert_eq!(served(&s), a.der);
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new certificate never served"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The connection made before keeps working.
    let (status, _) = h1_get(first, "/echo").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_silent_tls_client_is_cut_at_the_header_timeout() {
    let dir = Dir::new();
    let c = cert();
    let g = gateway(
        &dir,
        &tls_yaml(&dir, &c, 9, "limits: { header_timeout: 1s }\n"),
    )
    .await;
    let mut s = TcpStream::connect(("127.0.0.1", g.port)).await.unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf))
        .await
        .expect("a client that never starts its handshake is cut");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
}

/// `check FILE`: its exit code and standard error.
async fn check(file: &Path) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_norepeat-gateway"))
        .arg("check")
        .arg(file)
        .output()
        .await
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn check_names_a_missing_invalid_or_mismatched_certificate_by_its_field() {
    let dir = Dir::new();
    let (a, b) = (cert(), cert());
    let cert_a = dir.put("a.pem", &a.pem);
    let key_a = dir.put("a.key", &a.key);
    let key_b = dir.put("b.key", &b.key);
    let junk = dir.put("junk.pem", "not a certificate\n");
    let cases = [
        (
            format!(
                "tls: {{ cert: {}/none.pem, key: {} }}",
                dir.0.display(),
                key_a.display()
            ),
            "tls.cert: cannot read",
        ),
        (
            format!(
                "tls: {{ cert: {}, key: {} }}",
                junk.display(),
                key_a.display()
            ),
            "tls.cert: no PEM certificate",
        ),
        (
            format!(
                "tls: {{ cert: {}, key: {} }}",
                cert_a.display(),
                junk.display()
            ),
            "tls.key: ",
        ),
        (
            format!(
                "tls: {{ cert: {}, key: {} }}",
                cert_a.display(),
                key_b.display()
            ),
            "does not go with the certificate",
        ),
        (
            format!("tls: {{ cert: {} }}", cert_a.display()),
            "tls.key: missing",
        ),
        (
            format!("upstream_ca: {}/none.pem", dir.0.display()),
            "upstream_ca: cannot read",
        ),
        (
            format!("upstream_ca: {}", junk.display()),
            "upstream_ca: no PEM",
        ),
    ];
    for (yaml, wanted) in cases {
        let file = dir.put(
            "g.yaml",
            &format!("upstream: https://127.0.0.1:9443\n{yaml}\n"),
        );
        let (code, err) = check(&file).await;
        assert_eq!(code, Some(2), "{yaml}: {err}");
        assert!(err.contains(wanted), "{yaml}: wanted {wanted:?} in {err}");
    }
    let file = dir.put(
        "g.yaml",
        &format!(
            "upstream: https://127.0.0.1:9443\nupstream_ca: {}\ntls: {{ cert: {}, key: {} }}\n",
            cert_a.display(),
            cert_a.display(),
            key_a.display()
        ),
    );
    let (code, err) = check(&file).await;
    assert_eq!(code, Some(0), "{err}");
}
