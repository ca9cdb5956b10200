//! Small shared helpers: free ports, temporary directories, redis one-shots.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use rand::RngExt as _;

/// Returns a TCP port on 127.0.0.1 that was free a moment ago.
///
/// The port is found by binding `127.0.0.1:0` and releasing the listener, so
/// another process may grab it before the caller does; callers that start a
/// server on it should retry with a new port when binding fails.
///
/// # Panics
///
/// Panics when no loopback port can be bound at all (broken test environment).
pub fn free_port() -> u16 {
    let mut last_err = None;
    for _ in 0..10 {
        match TcpListener::bind(("127.0.0.1", 0)).and_then(|l| l.local_addr()) {
            Ok(addr) => return addr.port(),
            Err(e) => last_err = Some(e),
        }
    }
    panic!("norepeat-testkit: cannot bind any free port on 127.0.0.1: {last_err:?}");
}

/// Random lowercase hex string of `bytes * 2` characters.
pub(crate) fn random_hex(bytes: usize) -> String {
    let mut rng = rand::rng();
    (0..bytes)
        .map(|_| format!("{:02x}", rng.random::<u8>()))
        .collect()
}

/// A directory under the system temp dir, removed (recursively) on drop.
#[derive(Debug)]
pub(crate) struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates a new, empty, uniquely named directory.
    pub(crate) fn new(prefix: &str) -> TempDir {
        let base = std::env::temp_dir();
        for _ in 0..10 {
            let path = base.join(format!("{prefix}-{}-{}", std::process::id(), random_hex(6)));
            match std::fs::create_dir(&path) {
                Ok(()) => return TempDir { path },
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => panic!(
                    "norepeat-testkit: cannot create temp dir {}: {e}",
                    path.display()
                ),
            }
        }
        panic!(
            "norepeat-testkit: cannot create a unique temp dir under {}",
            base.display()
        );
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        match std::fs::remove_dir_all(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot remove temp dir");
            }
        }
    }
}

/// SIGKILLs a child process (if still running) and reaps it.
pub(crate) fn kill_and_reap(child: &mut Child) {
    match child.try_wait() {
        Ok(Some(_)) => {}
        _ => {
            // `Child::kill` sends SIGKILL on Unix.
            if let Err(e) = child.kill() {
                tracing::debug!(pid = child.id(), error = %e, "kill failed (already exited?)");
            }
            if let Err(e) = child.wait() {
                tracing::warn!(pid = child.id(), error = %e, "cannot reap child process");
            }
        }
    }
}

/// Reads the tail of a log file, for panic messages.
pub(crate) fn log_tail(path: &Path) -> String {
    match std::fs::read_to_string(path) {
        Ok(s) => {
            let lines: Vec<&str> = s.lines().collect();
            let start = lines.len().saturating_sub(20);
            lines[start..].join("\n")
        }
        Err(e) => format!("<cannot read {}: {e}>", path.display()),
    }
}

/// Path of the `redis-server` binary (`NOREPEAT_REDIS_SERVER` overrides).
pub(crate) fn redis_server_bin() -> String {
    std::env::var("NOREPEAT_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

/// Path of the `redis-cli` binary (`NOREPEAT_REDIS_CLI` overrides).
pub(crate) fn redis_cli_bin() -> String {
    std::env::var("NOREPEAT_REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_owned())
}

/// Opens a multiplexed connection to `redis://127.0.0.1:port` with short timeouts.
pub(crate) async fn connect_port(
    port: u16,
    response_timeout: Duration,
) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(response_timeout));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

/// Runs one command against the node on `port` over a fresh connection.
pub(crate) async fn query_port<T: redis::FromRedisValue>(
    port: u16,
    cmd: &redis::Cmd,
) -> redis::RedisResult<T> {
    let mut con = connect_port(port, Duration::from_secs(5)).await?;
    cmd.query_async(&mut con).await
}

/// Every key on the server at `port` with its `PTTL` (-1: no expiry), found
/// with `SCAN` (never `KEYS`), sorted by key.
///
/// # Panics
///
/// Panics when the server cannot be reached.
pub(crate) async fn keys_with_pttl_on(port: u16) -> Vec<(String, i64)> {
    let mut con = connect_port(port, Duration::from_secs(5))
        .await
        .unwrap_or_else(|e| panic!("norepeat-testkit: cannot connect to port {port}: {e}"));
    let mut cursor: u64 = 0;
    let mut found = Vec::new();
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut con)
            .await
            .unwrap_or_else(|e| panic!("norepeat-testkit: SCAN on port {port}: {e}"));
        for key in keys {
            let pttl: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query_async(&mut con)
                .await
                .unwrap_or_else(|e| panic!("norepeat-testkit: PTTL {key} on port {port}: {e}"));
            found.push((key, pttl));
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    // SCAN may return a key twice.
    found.sort();
    found.dedup_by(|a, b| a.0 == b.0);
    found
}

/// True when the node on `port` answers PING with PONG.
pub(crate) async fn pings(port: u16) -> bool {
    let attempt = async {
        let mut con = connect_port(port, Duration::from_millis(500)).await?;
        redis::cmd("PING").query_async::<String>(&mut con).await
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), attempt).await,
        Ok(Ok(ref s)) if s == "PONG"
    )
}

/// Outcome of waiting for a freshly spawned redis-server.
pub(crate) enum StartOutcome {
    /// It answers PING.
    Up,
    /// The process exited (e.g. the port was taken); the log tail is attached.
    Exited(String),
    /// It neither answered nor exited before the deadline.
    TimedOut,
}

/// Waits until the redis-server `child` on `port` answers PING.
pub(crate) async fn wait_redis_up(
    child: &mut Child,
    port: u16,
    log: &Path,
    timeout: Duration,
) -> StartOutcome {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return StartOutcome::Exited(format!("exit status {status}; log:\n{}", log_tail(log)));
        }
        if pings(port).await {
            return StartOutcome::Up;
        }
        if Instant::now() >= deadline {
            return StartOutcome::TimedOut;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
