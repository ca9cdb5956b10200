//! Runs a built server binary (`BIN serve --listen 127.0.0.1:0`) for end-to-end tests.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt as _, AsyncRead, BufReader};
use tokio::process::{Child, Command};

/// How long the binary gets to print its `listening on` line.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// The environment variable holding the payment provider's secret: when a
/// shop runs with it, every `POST /payments/callback` must be signed (see
/// [`sign_callback`]).
pub const CALLBACK_SECRET_ENV: &str = "NOREPEAT_CALLBACK_SECRET";

/// The `Norepeat-Signature` header value a payment provider holding `secret`
/// puts on a callback whose raw body is `body`, sent at `timestamp` (unix
/// seconds): `t=<timestamp>,v1=<hex HMAC-SHA256(secret, "<timestamp>." + body)>`.
///
/// Written apart from the library's `norepeat::webhook` on purpose, so a
/// test signing with it checks the shop against the contract, not against
/// itself.
pub fn sign_callback(secret: &str, timestamp: u64, body: &[u8]) -> String {
    use hmac::{Hmac, KeyInit, Mac};
    let mut mac = <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(secret.as_bytes())
        .expect("norepeat-testkit: HMAC takes keys of any length");
    mac.update(format!("{timestamp}.").as_bytes());
    mac.update(body);
    format!(
        "t={timestamp},v1={}",
        hex::encode(mac.finalize().into_bytes())
    )
}

/// [`sign_callback`] at the current time.
pub fn sign_callback_now(secret: &str, body: &[u8]) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    sign_callback(secret, now, body)
}

/// The variables a started binary keeps from the test's environment: what
/// a process needs to run at all (`PATH`, `HOME`, the temporary directory)
/// and what only changes how a failure is reported (`RUST_BACKTRACE`).
/// Everything else (a developer's `REDIS_URL`, `DATABASE_URL`, `NATS_URL`,
/// `NOREPEAT_*`, `RUST_LOG`) is left out, so a test of the embedded
/// defaults checks the defaults on every machine.
pub const KEPT_ENV: [&str; 4] = ["PATH", "HOME", "TMPDIR", "RUST_BACKTRACE"];

/// The marker searched for in stdout.
const LISTENING_MARKER: &str = "listening on http://";

/// A running server binary started as `BIN serve --listen 127.0.0.1:0`.
///
/// [`start`](Self::start) waits until the process prints a line containing
/// `listening on http://HOST:PORT` on stdout; all other output (stdout and
/// stderr) is forwarded to the test's stderr by background tasks. The process
/// is SIGKILLed on drop. It starts from a cleared environment: only
/// [`KEPT_ENV`] and the variables the test gives.
///
/// ```no_run
/// use norepeat_testkit::{RedisServer, ShopProcess};
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
///
/// # async fn demo(bin: &str) {
/// // `bin` is the shop's binary: `env!("CARGO_BIN_EXE_norepeat")` in the
/// // shop's own tests (this crate's doc tests have no binary to start).
/// let redis = RedisServer::start().await;
/// let shop = ShopProcess::start(bin, vec![("REDIS_URL".to_owned(), redis.url())]).await;
///
/// let addr = shop.base_url().trim_start_matches("http://").to_owned();
/// let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
/// conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n")
///     .await
///     .unwrap();
/// let mut answer = String::new();
/// conn.read_to_string(&mut answer).await.unwrap();
/// assert!(answer.starts_with("HTTP/1.1 200"));
/// assert!(answer.contains(r#""store":"redis""#));
/// # }
/// ```
#[derive(Debug)]
pub struct ShopProcess {
    child: Option<Child>,
    base_url: String,
    bin: PathBuf,
}

impl ShopProcess {
    /// Starts `bin serve --listen 127.0.0.1:0` with the variables `env` (and
    /// [`KEPT_ENV`], nothing else of the test's environment) and waits (up to
    /// 60 s) for its `listening on` line.
    ///
    /// # Panics
    ///
    /// Panics when the binary cannot be spawned, exits, or does not announce
    /// its address in time.
    pub async fn start(bin: impl AsRef<Path>, env: Vec<(String, String)>) -> ShopProcess {
        Self::start_with_args(bin, Vec::new(), env).await
    }

    /// Like [`start`](Self::start), appending `extra_args` after
    /// `serve --listen 127.0.0.1:0`.
    ///
    /// # Panics
    ///
    /// Same as [`start`](Self::start).
    pub async fn start_with_args(
        bin: impl AsRef<Path>,
        extra_args: Vec<String>,
        env: Vec<(String, String)>,
    ) -> ShopProcess {
        let mut args: Vec<String> = ["serve", "--listen", "127.0.0.1:0"]
            .map(String::from)
            .into();
        args.extend(extra_args);
        Self::spawn(bin, args, env).await
    }

    /// Starts `bin` with exactly `args` (any server that prints
    /// `listening on http://HOST:PORT` once ready: the gateway, a test's own
    /// backend), from the same cleared environment as [`start`](Self::start),
    /// and waits (up to 60 s) for that line.
    ///
    /// # Panics
    ///
    /// Same as [`start`](Self::start).
    pub async fn spawn(
        bin: impl AsRef<Path>,
        args: Vec<String>,
        env: Vec<(String, String)>,
    ) -> ShopProcess {
        let bin = bin.as_ref().to_path_buf();
        let mut child = Command::new(&bin)
            .args(&args)
            .env_clear()
            .envs(
                KEPT_ENV
                    .iter()
                    .filter_map(|k| Some((*k, std::env::var_os(k)?))),
            )
            .envs(env)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("norepeat-testkit: cannot spawn {}: {e}", bin.display()));
        let name = bin
            .file_name()
            .map_or_else(|| "server".to_owned(), |n| n.to_string_lossy().into_owned());
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(forward_lines(stderr, format!("[{name} stderr]")));
        }
        let stdout = child
            .stdout
            .take()
            .expect("norepeat-testkit: stdout was configured as piped");
        let mut lines = BufReader::new(stdout).lines();
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        let base_url = loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let line = match tokio::time::timeout(remaining, lines.next_line()).await {
                Ok(Ok(Some(line))) => line,
                Ok(Ok(None)) | Ok(Err(_)) => {
                    let status = wait_briefly(&mut child).await;
                    panic!(
                        "norepeat-testkit: {} closed stdout before printing `{LISTENING_MARKER}...` \
                         (exit status: {status})",
                        bin.display()
                    );
                }
                Err(_) => {
                    let _ = child.start_kill();
                    panic!(
                        "norepeat-testkit: {} did not print `{LISTENING_MARKER}...` within {STARTUP_TIMEOUT:?}",
                        bin.display()
                    );
                }
            };
            eprintln!("[{name} stdout] {line}");
            if let Some(url) = parse_listening(&line) {
                break url;
            }
        };
        // Keep draining stdout so the child never blocks on a full pipe.
        let prefix = format!("[{name} stdout]");
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("{prefix} {line}");
            }
        });
        tracing::debug!(%base_url, "server process is listening");
        ShopProcess {
            child: Some(child),
            base_url,
            bin,
        }
    }

    /// `http://HOST:PORT` as announced by the process (no trailing slash).
    pub fn base_url(&self) -> String {
        self.base_url.clone()
    }

    /// The OS process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// True while the process has not exited or been killed.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Sends `SIGTERM` (what a process manager sends to stop a service
    /// gracefully), through `kill -TERM`. Does nothing if it already ended.
    ///
    /// # Panics
    ///
    /// Panics when `kill` cannot be run.
    pub fn terminate(&self) {
        if let Some(pid) = self.pid() {
            let status = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .unwrap_or_else(|e| panic!("norepeat-testkit: cannot run kill: {e}"));
            tracing::debug!(pid, %status, "sent SIGTERM");
        }
    }

    /// Waits up to `within` for the process to exit, and reaps it: its exit
    /// status, or `None` while it still runs (or was already reaped).
    pub async fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let child = self.child.as_mut()?;
        let status = tokio::time::timeout(within, child.wait())
            .await
            .ok()?
            .ok()?;
        self.child = None;
        Some(status)
    }

    /// SIGKILLs the process and reaps it. Does nothing if it already ended.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            if let Err(e) = child.start_kill() {
                tracing::debug!(bin = %self.bin.display(), error = %e, "kill failed");
            }
            // SIGKILL is immediate; poll briefly so no zombie is left behind.
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                match child.try_wait() {
                    Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                    Ok(Some(_)) | Err(_) => return,
                }
            }
            tracing::warn!(bin = %self.bin.display(), "process did not exit after SIGKILL");
        }
    }
}

impl Drop for ShopProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Extracts `http://HOST:PORT` from a line containing `listening on http://...`.
fn parse_listening(line: &str) -> Option<String> {
    let start = line.find(LISTENING_MARKER)? + "listening on ".len();
    let url: String = line[start..]
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != '\u{1b}' && *c != '"' && *c != '\'')
        .collect();
    let url = url.trim_end_matches(['/', ',', '.', ';']).to_owned();
    (url.len() > "http://".len()).then_some(url)
}

/// Gives an exiting child a moment to report its status.
async fn wait_briefly(child: &mut Child) -> String {
    match tokio::time::timeout(Duration::from_secs(2), child.wait()).await {
        Ok(Ok(status)) => status.to_string(),
        Ok(Err(e)) => format!("unknown ({e})"),
        Err(_) => "still running".to_owned(),
    }
}

/// Forwards every line of `reader` to stderr with `prefix`.
async fn forward_lines(reader: impl AsyncRead + Unpin, prefix: String) {
    let mut lines = BufReader::new(reader).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        eprintln!("{prefix} {line}");
    }
}

#[cfg(test)]
mod tests {
    use super::parse_listening;

    #[test]
    fn signs_as_the_contract_says() {
        // HMAC-SHA256("secret", "1700000000.{}"), computed with openssl.
        assert_eq!(
            super::sign_callback("secret", 1_700_000_000, b"{}"),
            "t=1700000000,v1=b8569b78799ff9e3cbff0fc2d63a33a2b57f3282abd07c37ae5e8e7d79a5f163"
        );
    }

    #[test]
    fn parses_listening_lines() {
        assert_eq!(
            parse_listening("listening on http://127.0.0.1:4321").as_deref(),
            Some("http://127.0.0.1:4321")
        );
        assert_eq!(
            parse_listening("2024 INFO shop: listening on http://127.0.0.1:80/ extra").as_deref(),
            Some("http://127.0.0.1:80")
        );
        assert_eq!(parse_listening("starting"), None);
    }
}
