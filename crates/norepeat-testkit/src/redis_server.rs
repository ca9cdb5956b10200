//! A private `redis-server` process on a free loopback port.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::util::{
    StartOutcome, TempDir, connect_port, keys_with_pttl_on, kill_and_reap, log_tail,
    redis_server_bin, wait_redis_up,
};

/// How long a freshly spawned server gets to answer PING.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How many ports `start` tries before giving up.
const START_ATTEMPTS: usize = 5;

/// A private `redis-server` listening on `127.0.0.1:<port>`, without persistence.
///
/// The server runs with `--save "" --appendonly no` in its own temporary
/// directory. Dropping the value SIGKILLs and reaps the process and removes
/// the directory.
///
/// ```no_run
/// use norepeat_testkit::RedisServer;
///
/// # async fn demo() {
/// let mut redis = RedisServer::start().await;
/// let client = redis::Client::open(redis.url()).expect("valid url");
/// redis.kill();            // simulate a crash
/// redis.restart().await;   // same port, empty data set
/// assert_eq!(redis.dbsize().await, 0);
/// # }
/// ```
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: TempDir,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a new server on a free port and waits until it answers PING.
    ///
    /// # Panics
    ///
    /// Panics when `redis-server` cannot be spawned or does not come up
    /// within 10 seconds (after a few attempts on different ports).
    pub async fn start() -> RedisServer {
        let dir = TempDir::new("norepeat-redis");
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            let port = crate::util::free_port();
            match spawn_redis(port, dir.path()).await {
                Ok(child) => {
                    return RedisServer {
                        port,
                        dir,
                        child: Some(child),
                    };
                }
                Err(e) => {
                    tracing::warn!(port, error = %e, "redis-server did not start, retrying");
                    failures.push(format!("port {port}: {e}"));
                }
            }
        }
        panic!(
            "norepeat-testkit: redis-server did not start after {START_ATTEMPTS} attempts:\n{}",
            failures.join("\n")
        );
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The TCP port the server listens on (stable across [`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The socket address `127.0.0.1:<port>` (handy for [`TcpProxy::start`](crate::proxy::TcpProxy::start)).
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// A `redis::Client` for [`url`](Self::url).
    ///
    /// # Panics
    ///
    /// Never in practice: the URL is always well formed.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("norepeat-testkit: redis url is well formed")
    }

    /// A new multiplexed connection with a 5 s response timeout.
    ///
    /// # Panics
    ///
    /// Panics when the server cannot be reached.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        connect_port(self.port, Duration::from_secs(5))
            .await
            .unwrap_or_else(|e| panic!("norepeat-testkit: cannot connect to {}: {e}", self.url()))
    }

    /// SIGKILLs the server (no shutdown, no save) and reaps the process.
    ///
    /// Does nothing when it is not running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child);
        }
    }

    /// Starts the server again on the same port, with an empty data set.
    ///
    /// Kills the current process first if it is still running.
    ///
    /// # Panics
    ///
    /// Panics when the server does not come up on the same port (for example
    /// because another process took the port in the meantime).
    pub async fn restart(&mut self) {
        self.kill();
        let mut failures = Vec::new();
        // The port may be briefly busy right after the kill; retry a few times.
        for _ in 0..START_ATTEMPTS {
            match spawn_redis(self.port, self.dir.path()).await {
                Ok(child) => {
                    self.child = Some(child);
                    return;
                }
                Err(e) => {
                    failures.push(e);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        panic!(
            "norepeat-testkit: redis-server did not restart on port {}:\n{}",
            self.port,
            failures.join("\n")
        );
    }

    /// True while the process is alive (not killed, not exited).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// `CONFIG SET name value`, e.g. `config_set("maxmemory", "1mb")` to provoke OOM errors.
    ///
    /// # Panics
    ///
    /// Panics when the server rejects the setting or cannot be reached.
    pub async fn config_set(&self, name: &str, value: &str) {
        let mut con = self.connection().await;
        redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query_async::<()>(&mut con)
            .await
            .unwrap_or_else(|e| panic!("norepeat-testkit: CONFIG SET {name} {value}: {e}"));
    }

    /// Every key with its `PTTL` in milliseconds (-1: no expiry), found
    /// with `SCAN`, sorted by key: for a test that checks how long the
    /// library keeps what it wrote.
    ///
    /// # Panics
    ///
    /// Panics when the server cannot be reached.
    pub async fn keys_with_pttl(&self) -> Vec<(String, i64)> {
        keys_with_pttl_on(self.port).await
    }

    /// All keys whose `PTTL` is `-1` (exist, no expiry), found with `SCAN`.
    ///
    /// Useful to assert that a library never leaves keys behind forever.
    ///
    /// # Panics
    ///
    /// Panics when the server cannot be reached.
    pub async fn keys_without_ttl(&self) -> Vec<String> {
        self.keys_with_pttl()
            .await
            .into_iter()
            .filter(|(_, pttl)| *pttl == -1)
            .map(|(key, _)| key)
            .collect()
    }

    /// Makes this server a replica of `master` (`REPLICAOF`) and waits
    /// until its link is up (`master_link_status:up`).
    ///
    /// # Panics
    ///
    /// Panics when the server cannot be reached or the link is not up
    /// within 30 s.
    pub async fn replicate(&self, master: &RedisServer) {
        let mut con = self.connection().await;
        redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(master.port())
            .query_async::<()>(&mut con)
            .await
            .unwrap_or_else(|e| panic!("norepeat-testkit: REPLICAOF: {e}"));
        for _ in 0..300 {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut con)
                .await
                .unwrap_or_else(|e| panic!("norepeat-testkit: INFO replication: {e}"));
            if info.contains("master_link_status:up") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "norepeat-testkit: the replica on {} did not link to {} within 30 s",
            self.port,
            master.port()
        );
    }

    /// Stops the process where it is (`SIGSTOP`): its connections stay
    /// open and nothing answers, as a stalled server's. [`resume`](Self::resume)
    /// goes on; a server left paused is killed as usual when dropped.
    ///
    /// # Panics
    ///
    /// Panics when it is not running or `kill` cannot be run.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a [`pause`](Self::pause)d process go on (`SIGCONT`).
    ///
    /// # Panics
    ///
    /// Panics when it is not running or `kill` cannot be run.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, which: &str) {
        let pid = self.child.as_ref().map(Child::id).unwrap_or_else(|| {
            panic!(
                "norepeat-testkit: redis-server on {} is not running",
                self.port
            )
        });
        let status = Command::new("kill")
            .args([which, &pid.to_string()])
            .status()
            .unwrap_or_else(|e| panic!("norepeat-testkit: cannot run kill: {e}"));
        assert!(
            status.success(),
            "norepeat-testkit: kill {which} {pid}: {status}"
        );
    }

    /// `DBSIZE`: the number of keys in database 0.
    ///
    /// # Panics
    ///
    /// Panics when the server cannot be reached.
    pub async fn dbsize(&self) -> u64 {
        let mut con = self.connection().await;
        redis::cmd("DBSIZE")
            .query_async(&mut con)
            .await
            .unwrap_or_else(|e| panic!("norepeat-testkit: DBSIZE: {e}"))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Spawns a standalone redis-server on `port` with `dir` as working directory
/// and waits until it answers PING.
async fn spawn_redis(port: u16, dir: &Path) -> Result<Child, String> {
    let log = dir.join(format!("redis-{port}.log"));
    let port_arg = port.to_string();
    let mut child = Command::new(redis_server_bin())
        .args(["--save", "", "--appendonly", "no", "--bind", "127.0.0.1"])
        .args(["--port", port_arg.as_str()])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| {
            format!(
                "cannot spawn {} (is redis-server installed?): {e}",
                redis_server_bin()
            )
        })?;
    match wait_redis_up(&mut child, port, &log, START_TIMEOUT).await {
        StartOutcome::Up => Ok(child),
        StartOutcome::Exited(msg) => {
            kill_and_reap(&mut child);
            Err(format!("redis-server exited: {msg}"))
        }
        StartOutcome::TimedOut => {
            kill_and_reap(&mut child);
            Err(format!(
                "redis-server did not answer PING within {START_TIMEOUT:?}; log:\n{}",
                log_tail(&log)
            ))
        }
    }
}
