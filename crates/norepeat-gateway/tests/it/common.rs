// Over 400 lines: what every gateway test shares; split, each test file would import from several.
//! What every gateway test shares: the kit's processes (the gateway binary,
//! `tests/backend.py`), their files, and small readers of their answers.

pub(crate) use norepeat_testkit::{RedisServer, ShopProcess, free_port};
pub(crate) use reqwest::{Client, Response, StatusCode};
pub(crate) use serde_json::Value;
pub(crate) use std::process::Stdio;
pub(crate) use std::time::Duration;
pub(crate) use tokio::io::{AsyncBufReadExt, BufReader};
pub(crate) use tokio::process::Command;

/// A server process of the test kit (killed when dropped, started from a
/// cleared environment), where it listens, and the gateway's file.
pub(crate) struct Process {
    pub(crate) process: ShopProcess,
    pub(crate) port: u16,
    /// A gateway's file.
    pub(crate) file: Option<std::path::PathBuf>,
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(f) = &self.file {
            let _ = std::fs::remove_file(f);
        }
    }
}

impl Process {
    /// Starts `bin args` and waits for its `listening on` line.
    pub(crate) async fn start(bin: &str, args: Vec<String>) -> Process {
        Self::start_env(bin, args, Vec::new()).await
    }

    /// [`Process::start`] with the variables `env`.
    pub(crate) async fn start_env(
        bin: &str,
        args: Vec<String>,
        env: Vec<(String, String)>,
    ) -> Process {
        let process = ShopProcess::spawn(bin, args, env).await;
        let port = process
            .base_url()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("a port in the announced address");
        Process {
            process,
            port,
            file: None,
        }
    }

    /// Sends `signal` (`-TERM`, `-HUP`) to the process.
    pub(crate) async fn signal(&self, signal: &str) {
        let pid = self.process.pid().expect("running").to_string();
        let sent = Command::new("kill").args([signal, &pid]).status().await;
        assert!(sent.unwrap().success(), "kill {signal} {pid}");
    }
}

pub(crate) async fn backend(port: u16) -> Process {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/backend.py");
    Process::start("python3", vec![script.to_owned(), port.to_string()]).await
}

/// Writes `yaml` to a file of its own; its path.
pub(crate) fn config_file(yaml: &str) -> std::path::PathBuf {
    temp_file("yaml", yaml.as_bytes())
}

/// A file of its own in the temporary directory, holding `text`.
pub(crate) fn temp_file(ext: &str, text: &[u8]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("norepeat-gw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{}.{ext}", free_port()));
    std::fs::write(&file, text).unwrap();
    file
}

/// Starts the gateway on `yaml` (a file written for it), listening on a
/// free port.
pub(crate) async fn gateway(yaml: &str) -> Process {
    gateway_with(yaml, &[]).await
}

/// [`gateway`] with more arguments (`--workers 3`).
pub(crate) async fn gateway_with(yaml: &str, more: &[&str]) -> Process {
    gateway_started(yaml, more, &[]).await
}

/// [`gateway`] with the variables `env` (secrets the file names).
pub(crate) async fn gateway_env(yaml: &str, env: &[(&str, &str)]) -> Process {
    gateway_started(yaml, &[], env).await
}

async fn gateway_started(yaml: &str, more: &[&str], env: &[(&str, &str)]) -> Process {
    let file = config_file(yaml);
    let mut args: Vec<String> = [
        "--config",
        &file.to_string_lossy(),
        "--listen",
        "127.0.0.1:0",
    ]
    .map(String::from)
    .into();
    args.extend(more.iter().map(|a| (*a).to_owned()));
    let env = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let mut p = Process::start_env(env!("CARGO_BIN_EXE_norepeat-gateway"), args, env).await;
    p.file = Some(file);
    p
}

pub(crate) fn url(p: &Process, path: &str) -> String {
    format!("http://127.0.0.1:{}{path}", p.port)
}

/// Waits until the backend has counted one request to `path` (it counts
/// before its delay): that request is in flight, however slow the machine.
pub(crate) async fn arrived(backend: &Process, path: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while effects(backend).await[path] != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path} never arrived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) async fn effects(backend: &Process) -> Value {
    reqwest::get(url(backend, "/effects"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// `GET /.norepeat/token` for `user` on gateway `g`: the JSON answer.
pub(crate) async fn token_for(g: &Process, user: &str) -> Value {
    Client::new()
        .get(url(g, "/.norepeat/token"))
        .header("x-user-id", user)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// `GET /.norepeat/healthz` on gateway `g`: the JSON answer.
pub(crate) async fn health(g: &Process) -> Value {
    Client::new()
        .get(url(g, "/.norepeat/healthz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// `healthz` on gateway `g` once its `field` is `want` (the store is
/// probed in the background each second: waited for up to 10 s).
pub(crate) async fn health_once(g: &Process, field: &str, want: Value) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let h = health(g).await;
        if h[field] == want || tokio::time::Instant::now() >= deadline {
            assert_eq!(h[field], want, "{h}");
            return h;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) async fn code(res: Response) -> (StatusCode, String) {
    let status = res.status();
    let body: Value = res.json().await.expect("a JSON body");
    (status, body["code"].as_str().unwrap_or_default().to_owned())
}

pub(crate) fn file(backend: &Process, store: &str, routes: &str) -> String {
    file_for(backend.port, store, routes)
}

/// The file of a gateway in front of a backend on `port`.
pub(crate) fn file_for(port: u16, store: &str, routes: &str) -> String {
    format!(
        "upstream: http://127.0.0.1:{port}\nstore: {store}\nidentity:\n  header: X-User-Id\nroutes:\n{routes}"
    )
}

pub(crate) const ROUTES: &str = "
  - match: POST /orders
    guard: token
  - match: POST /orders/quick
    guard: fingerprint
    window: 5s
    ignore_fields: [traceId]
  - match: POST /payments
    guard: idempotency
    retention: 1m
    timeout: 500ms
  - match: POST /refunds
    guard: idempotency
    ambiguous: release
    timeout: 500ms
  - match: POST /coupons/{id}/redeem
    guard: fingerprint
    shadow: true
  - match: GET /spoof
    guard: idempotency
    required: false
  - match: POST /flash-sale/{sku}
    rate_limit: { algorithm: gcra, rate: 2/m, burst: 2, by: identity }
";

pub(crate) fn rand_n() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Sends `head` (`METHOD PATH`) with `headers` and `body` over a plain TCP
/// connection, the path exactly as written (an HTTP client would clean
/// `/./` and `/../` before sending); the status and the whole answer.
pub(crate) async fn raw(
    g: &Process,
    head: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", g.port))
        .await
        .unwrap();
    let mut req = format!(
        "{head} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text}"));
    (status, text)
}

/// `name{labels} value` lines of the gateway's metrics.
pub(crate) async fn scrape(g: &Process) -> String {
    Client::new()
        .get(url(g, "/.norepeat/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of the counter `name{labels}` (0 when it is not there).
pub(crate) fn value(text: &str, name: &str, labels: &str) -> u64 {
    let prefix = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// Every label value of `label` on the series of `name`.
pub(crate) fn label_values(text: &str, name: &str, label: &str) -> Vec<String> {
    let key = format!("{label}=\"");
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter_map(|l| {
            let at = l.find(&key)? + key.len();
            Some(l[at..].split('"').next()?.to_owned())
        })
        .collect()
}

/// What the backend saw of `Idempotency-Attempt` on each POST to `path`.
pub(crate) async fn attempts(backend: &Process, path: &str) -> Vec<Value> {
    let all: Value = reqwest::get(url(backend, "/attempts"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    all[path].as_array().cloned().unwrap_or_default()
}

/// `POST path` with key `key` on gateway `g`.
pub(crate) async fn pay_on(g: &Process, path: &str, key: &str) -> Response {
    payment(g, path, key).send().await.unwrap()
}

/// The request [`pay_on`] sends, not sent.
pub(crate) fn payment(g: &Process, path: &str, key: &str) -> reqwest::RequestBuilder {
    Client::new()
        .post(url(g, path))
        .header("x-user-id", "u1")
        .header("idempotency-key", key)
        .body("{}")
}

/// The first line of the access log at `log` that contains `needle`,
/// waited for up to 10 s (the line is written when the request ends).
pub(crate) async fn log_line(log: &std::path::Path, needle: &str) -> String {
    log_lines(log, needle, 1).await.swap_remove(0)
}

/// The lines of the access log at `log` that contain `needle`, once there
/// are at least `n` of them (waited for up to 10 s).
pub(crate) async fn log_lines(log: &std::path::Path, needle: &str, n: usize) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let lines: Vec<String> = text
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect();
        if lines.len() >= n {
            return lines;
        }
        assert!(tokio::time::Instant::now() < deadline, "no line: {text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A new TCP connection to the gateway `g`.
pub(crate) async fn connect(g: &Process) -> tokio::net::TcpStream {
    tokio::net::TcpStream::connect(("127.0.0.1", g.port))
        .await
        .unwrap()
}

/// One request head from `s`, read a byte at a time up to its blank line
/// (nothing of its body): `None` once the connection ends first.
pub(crate) async fn read_head_bytes(s: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    Some(head)
}

/// Writes `bytes` on a new TCP connection to `g` and reads until the
/// gateway closes it (at most 10 s): what came back, as text.
pub(crate) async fn over_tcp(g: &Process, bytes: &[u8]) -> String {
    use tokio::io::AsyncWriteExt;
    let mut s = connect(g).await;
    s.write_all(bytes).await.unwrap();
    read_rest(&mut s).await
}

/// Reads `s` until the gateway closes it (at most 10 s), as text.
pub(crate) async fn read_rest(s: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("the gateway closed the connection")
        .ok();
    String::from_utf8_lossy(&out).into_owned()
}

/// An access log's path, in a directory of its own that goes with it.
pub(crate) struct AccessLog {
    dir: std::path::PathBuf,
    path: std::path::PathBuf,
}

impl AccessLog {
    pub(crate) fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("norepeat-gw-log-{}", rand_n()));
        std::fs::create_dir_all(&dir).unwrap();
        Self {
            path: dir.join("access.log"),
            dir,
        }
    }
}

impl std::ops::Deref for AccessLog {
    type Target = std::path::Path;

    fn deref(&self) -> &std::path::Path {
        &self.path
    }
}

impl AsRef<std::path::Path> for AccessLog {
    fn as_ref(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for AccessLog {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
