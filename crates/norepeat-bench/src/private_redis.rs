//! A `redis-server` of the bench's own: where memory per key is counted
//! (`probe.rs`) and where the replicas row keeps its master and replica
//! (`rows/replicas.rs`). Beneath both, so neither imports the other.

use super::error::BenchError;
use std::time::Duration;

/// A `redis-server` of the bench's own on a free loopback port, stopped
/// when dropped. Nothing else writes to it, nothing of other runs is in
/// it, and it holds no keys to rehash: the cleanest place to count bytes.
pub(crate) struct PrivateRedis {
    child: tokio::process::Child,
    pub(crate) url: String,
    /// Its working directory (a replica writes the master's snapshot
    /// there), removed with it: never the user's.
    dir: std::path::PathBuf,
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl PrivateRedis {
    /// Its process id (`None` once it has been waited for).
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Starts one, or says why not (no `redis-server` on the `PATH`).
    pub(crate) async fn start() -> Result<Self, BenchError> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let dir = std::env::temp_dir().join(format!(
            "norepeat-bench-redis-{}-{port}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir)?;
        let child = tokio::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&dir)
            .args(["--save", "", "--appendonly", "no"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(BenchError::Probe(format!("redis-server not started: {e}")));
            }
        };
        // From here on, dropped (an error below), it is stopped and its
        // directory removed.
        let this = Self {
            child,
            url: format!("redis://127.0.0.1:{port}"),
            dir,
        };
        let client = redis::Client::open(this.url.as_str())?;
        for _ in 0..100 {
            if let Ok(mut con) = client.get_multiplexed_async_connection().await {
                let pong: redis::RedisResult<String> =
                    redis::cmd("PING").query_async(&mut con).await;
                if pong.is_ok() {
                    return Ok(this);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(BenchError::Probe(format!(
            "redis-server on {port} did not answer"
        )))
    }
}
