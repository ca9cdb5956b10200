//! `idempotent-proxy-server` 1.2.2 (ldclabs) as the idempotency rows'
//! anchor: the Rust peer of the gateway's idempotency route, on the same
//! backend and the same Redis (its in-memory cache when the bench runs on
//! memory).
//!
//! It forwards `/URL_BE` to the URL in its environment variable `URL_BE`
//! (here the backend's `/orders`), claims `ANON:POST:<Idempotency-Key>` by
//! `SET NX PX`, stores the answer with `SET XX PX`, and answers a repeated
//! key from the stored one. It reads its settings from the environment and
//! insists on a `.env` file in its directory: both are given, in a
//! directory of its own. Its log is `warn`: like the gateway's access log
//! and NGINX's here, no line a request.

use super::super::super::error::BenchError;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

/// How to get the binary.
pub(super) const INSTALL: &str = "cargo install idempotent-proxy-server --version 1.2.2 --locked, then --idempotent-proxy ~/.cargo/bin/idempotent-proxy-server";

/// The path requests go to: `/` and the name of the variable holding the
/// upstream URL.
pub(super) const PATH: &str = "/URL_BE";

/// How long it may take to accept connections.
const DEADLINE: Duration = Duration::from_secs(10);

/// One running `idempotent-proxy-server`, killed (and its directory
/// removed) when dropped.
pub(super) struct IdempotentProxy {
    child: Child,
    pub(super) base_url: String,
    dir: PathBuf,
}

impl IdempotentProxy {
    /// Starts `bin` in front of `backend`, its records on the Redis at
    /// `redis` (in its own memory without one); returns once it accepts
    /// connections.
    pub(super) async fn start(
        bin: &Path,
        backend: &str,
        redis: Option<&str>,
    ) -> Result<Self, BenchError> {
        let dir = std::env::temp_dir().join(format!(
            "norepeat-idempotent-proxy-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
            .create(&dir)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let env = settings(port, backend, redis);
        // It panics without a `.env`; the environment below wins over it.
        std::fs::write(
            dir.join(".env"),
            env.iter()
                .map(|(k, v)| format!("{k}={v}\n"))
                .collect::<String>(),
        )?;
        let mut cmd = Command::new(bin);
        cmd.current_dir(&dir)
            .env_clear()
            .envs(env)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("stderr.log"))?)
            .kill_on_drop(true);
        let child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(BenchError::unexpected(
                    "gateway.idempotent_proxy",
                    format!("cannot start {}: {e}", bin.display()),
                ));
            }
        };
        let mut proxy = Self {
            child,
            base_url: format!("http://127.0.0.1:{port}"),
            dir,
        };
        let deadline = Instant::now() + DEADLINE;
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Ok(proxy);
            }
            let exited = proxy.child.try_wait().ok().flatten().is_some();
            if exited || Instant::now() >= deadline {
                let said =
                    std::fs::read_to_string(proxy.dir.join("stderr.log")).unwrap_or_default();
                return Err(BenchError::unexpected(
                    "gateway.idempotent_proxy",
                    format!(
                        "{} {} on port {port}: {said}",
                        bin.display(),
                        if exited {
                            "exited"
                        } else {
                            "did not accept connections within 10 s"
                        }
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub(super) fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

impl Drop for IdempotentProxy {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Its environment: where it listens, the one upstream URL, the Redis,
/// its log level. Its records live `REQUEST_TIMEOUT` (10 s, its default):
/// longer than a row.
fn settings(port: u16, backend: &str, redis: Option<&str>) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("SERVER_ADDR", format!("127.0.0.1:{port}")),
        ("URL_BE", format!("{backend}/orders")),
        ("LOG_LEVEL", "warn".to_owned()),
        ("REQUEST_TIMEOUT", "10000".to_owned()),
    ];
    if let Some(url) = redis {
        env.push(("REDIS_URL", url.to_owned()));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_is_told_its_upstream_and_the_benchs_redis() {
        let env = settings(9, "http://127.0.0.1:8", Some("redis://127.0.0.1:6411"));
        let get = |k: &str| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("URL_BE"), Some("http://127.0.0.1:8/orders"));
        assert_eq!(PATH.strip_prefix('/'), Some("URL_BE"));
        assert_eq!(get("REDIS_URL"), Some("redis://127.0.0.1:6411"));
        assert_eq!(get("SERVER_ADDR"), Some("127.0.0.1:9"));
        assert_eq!(
            settings(9, "http://b", None)
                .iter()
                .find(|(k, _)| *k == "REDIS_URL"),
            None
        );
    }
}
