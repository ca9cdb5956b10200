// Over 400 lines: one group's six processes and its failover helpers (start, kill, demote, wait), which share its ports and temp dir.
//! A Redis master with two replicas and three Sentinels, on loopback.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::{
    StartOutcome, TempDir, keys_with_pttl_on, kill_and_reap, log_tail, query_port,
    redis_server_bin, wait_redis_up,
};

/// The name the Sentinels know the master by.
pub const MASTER_NAME: &str = "norepeat";

/// How long the Sentinels wait for a silent master before they call it
/// down (`down-after-milliseconds`): short, so a test's failover takes
/// seconds (Redis's default is 30 s).
pub const DOWN_AFTER: Duration = Duration::from_millis(1000);

/// `failover-timeout`: how long a failover may take before another
/// Sentinel may try again (Redis's default is 3 minutes).
const FAILOVER_TIMEOUT: Duration = Duration::from_millis(3000);

/// How long the group may take to form, or to fail over.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(40);

/// One process of the group.
#[derive(Debug)]
struct Process {
    port: u16,
    child: Option<Child>,
}

/// A master, two replicas and three Sentinels (quorum 2), each a
/// `redis-server` on a free loopback port, without persistence.
///
/// The Sentinels run with `down-after-milliseconds` 1000 and
/// `failover-timeout` 3000, so a master killed with SIGKILL is replaced
/// by a replica within a few seconds. Dropping the value kills every
/// process and removes the temporary directory.
///
/// ```no_run
/// use norepeat_testkit::RedisSentinels;
///
/// # async fn demo() {
/// let mut group = RedisSentinels::start().await;
/// let url = group.url(); // redis+sentinel://127.0.0.1:p1,.../norepeat
/// let old = group.kill_master().await;
/// let new = group.wait_for_failover(old).await;
/// assert_ne!(old, new);
/// # }
/// ```
#[derive(Debug)]
pub struct RedisSentinels {
    servers: Vec<Process>,
    sentinels: Vec<Process>,
    dir: TempDir,
}

impl RedisSentinels {
    /// Starts the master, its two replicas and three Sentinels, and waits
    /// until both replicas are linked and every Sentinel sees both
    /// replicas and the two other Sentinels.
    ///
    /// # Panics
    ///
    /// Panics when a process cannot be started or the group does not form
    /// within 40 seconds.
    pub async fn start() -> RedisSentinels {
        let mut group = RedisSentinels {
            servers: Vec::new(),
            sentinels: Vec::new(),
            dir: TempDir::new("norepeat-sentinel"),
        };
        let master = group.spawn(Role::Master).await;
        group.servers.push(master);
        let master_port = group.servers[0].port;
        for _ in 0..2 {
            let replica = group.spawn(Role::Replica(master_port)).await;
            group.servers.push(replica);
        }
        for _ in 0..3 {
            let sentinel = group.spawn(Role::Sentinel(master_port)).await;
            group.sentinels.push(sentinel);
        }
        group.wait_for(Check::Formed(master_port)).await;
        group
    }

    /// `redis+sentinel://127.0.0.1:s1,127.0.0.1:s2,127.0.0.1:s3/norepeat`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis+sentinel://{}/{MASTER_NAME}", hosts.join(","))
    }

    /// The ports of the master and the replicas, as started (a killed
    /// one included).
    pub fn server_ports(&self) -> Vec<u16> {
        self.servers.iter().map(|s| s.port).collect()
    }

    /// The port of the master the Sentinels name now (the first Sentinel
    /// that answers).
    ///
    /// # Panics
    ///
    /// Panics when no Sentinel answers.
    pub async fn master_port(&self) -> u16 {
        let mut errors = Vec::new();
        for s in &self.sentinels {
            match master_of(s.port).await {
                Ok(port) => return port,
                Err(e) => errors.push(format!("sentinel {}: {e}", s.port)),
            }
        }
        panic!(
            "norepeat-testkit: no Sentinel names the master: {}",
            errors.join("; ")
        );
    }

    /// SIGKILLs the master the Sentinels name now, and returns its port.
    pub async fn kill_master(&mut self) -> u16 {
        let port = self.master_port().await;
        if let Some(mut child) = self
            .servers
            .iter_mut()
            .find(|s| s.port == port)
            .and_then(|s| s.child.take())
        {
            kill_and_reap(&mut child);
        }
        tracing::info!(port, "killed the Sentinels' master");
        port
    }

    /// Waits until every Sentinel names a master other than `old`, and
    /// that server says it is master; returns its port.
    ///
    /// # Panics
    ///
    /// Panics when this does not happen within 40 seconds.
    pub async fn wait_for_failover(&self, old: u16) -> u16 {
        self.wait_for(Check::FailedOver(old)).await;
        self.master_port().await
    }

    /// Asks a Sentinel for a failover (`SENTINEL FAILOVER`): the master is
    /// demoted to a replica of the one promoted, and stays up. Returns the
    /// new master's port once every Sentinel names it and the old master
    /// calls itself a replica (the Sentinels convert it a moment after
    /// the promotion: until then both answer as masters).
    ///
    /// # Panics
    ///
    /// Panics when the Sentinel refuses, or the failover does not happen
    /// within 40 seconds.
    pub async fn demote_master(&self) -> u16 {
        let old = self.master_port().await;
        let port = self.sentinels[0].port;
        let () = query_port(
            port,
            redis::cmd("SENTINEL").arg("FAILOVER").arg(MASTER_NAME),
        )
        .await
        .unwrap_or_else(|e| panic!("norepeat-testkit: SENTINEL FAILOVER on {port}: {e}"));
        let new = self.wait_for_failover(old).await;
        self.wait_for(Check::Demoted(old)).await;
        new
    }

    /// Every key on the server at `port` with its `PTTL` (-1: no expiry).
    ///
    /// # Panics
    ///
    /// Panics when the server cannot be reached.
    pub async fn keys_with_pttl(&self, port: u16) -> Vec<(String, i64)> {
        keys_with_pttl_on(port).await
    }

    /// Waits until `check` finds no problem.
    async fn wait_for(&self, check: Check) {
        let deadline = Instant::now() + HEALTH_TIMEOUT;
        loop {
            let problem = match check {
                Check::Formed(master) => self.formed(master).await,
                Check::FailedOver(old) => self.failed_over(old).await,
                Check::Demoted(old) => not_replica(old)
                    .await
                    .map(|role| format!("old master {old}: {role}")),
            };
            let Some(problem) = problem else {
                return;
            };
            if Instant::now() >= deadline {
                let logs: Vec<String> = self
                    .servers
                    .iter()
                    .chain(&self.sentinels)
                    .map(|p| {
                        let log = self.dir.path().join(format!("redis-{}.log", p.port));
                        format!("--- {} ---\n{}", p.port, log_tail(&log))
                    })
                    .collect();
                panic!(
                    "norepeat-testkit: Sentinel group not ready after {HEALTH_TIMEOUT:?}: {problem}\n{}",
                    logs.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// What keeps the group from being formed around `master`, if anything.
    async fn formed(&self, master: u16) -> Option<String> {
        for r in &self.servers[1..] {
            let repl: String = match query_port(r.port, redis::cmd("INFO").arg("replication")).await
            {
                Ok(s) => s,
                Err(e) => return Some(format!("replica {}: {e}", r.port)),
            };
            if !repl.lines().any(|l| l.trim() == "master_link_status:up") {
                return Some(format!("replica {}: master link not up", r.port));
            }
        }
        for s in &self.sentinels {
            let fields = match sentinel_master(s.port).await {
                Ok(f) => f,
                Err(e) => return Some(format!("sentinel {}: {e}", s.port)),
            };
            let field = |name: &str| {
                fields
                    .iter()
                    .find(|(k, _)| k == name)
                    .map_or("", |(_, v)| v.as_str())
            };
            if field("port") != master.to_string() {
                return Some(format!("sentinel {} names port {}", s.port, field("port")));
            }
            if field("num-slaves") != "2" || field("num-other-sentinels") != "2" {
                return Some(format!(
                    "sentinel {} sees {} replicas and {} other sentinels",
                    s.port,
                    field("num-slaves"),
                    field("num-other-sentinels")
                ));
            }
        }
        None
    }

    /// What keeps the group from having failed over from `old`.
    async fn failed_over(&self, old: u16) -> Option<String> {
        let mut named = None;
        for s in &self.sentinels {
            match master_of(s.port).await {
                Ok(port) if port == old => {
                    return Some(format!("sentinel {} still names {old}", s.port));
                }
                Ok(port) => named = Some(port),
                Err(e) => return Some(format!("sentinel {}: {e}", s.port)),
            }
        }
        let port = named?;
        let role: Vec<redis::Value> = match query_port(port, &redis::cmd("ROLE")).await {
            Ok(r) => r,
            Err(e) => return Some(format!("new master {port}: {e}")),
        };
        match role.first() {
            Some(redis::Value::BulkString(b)) if b == b"master" => None,
            other => Some(format!("new master {port} has role {other:?}")),
        }
    }

    /// Spawns one process of the group on a free port.
    async fn spawn(&self, role: Role) -> Process {
        let mut failures = Vec::new();
        for _ in 0..5 {
            let port = crate::util::free_port();
            match spawn_server(port, role, self.dir.path()).await {
                Ok(child) => {
                    return Process {
                        port,
                        child: Some(child),
                    };
                }
                Err(e) => failures.push(format!("port {port}: {e}")),
            }
        }
        panic!(
            "norepeat-testkit: cannot start a {role:?}:\n{}",
            failures.join("\n")
        );
    }
}

impl Drop for RedisSentinels {
    fn drop(&mut self) {
        for p in self.sentinels.iter_mut().chain(&mut self.servers) {
            if let Some(mut child) = p.child.take() {
                kill_and_reap(&mut child);
            }
        }
    }
}

/// What [`RedisSentinels::wait_for`] waits for.
#[derive(Debug, Clone, Copy)]
enum Check {
    /// Replicas linked to the master on this port, Sentinels that see them
    /// and each other.
    Formed(u16),
    /// Every Sentinel names a master other than the one on this port.
    FailedOver(u16),
    /// The server on this port calls itself a replica.
    Demoted(u16),
}

/// `None` when the server at `port` calls itself a replica; else its
/// role, or why it gave none.
async fn not_replica(port: u16) -> Option<String> {
    match query_port::<Vec<redis::Value>>(port, &redis::cmd("ROLE")).await {
        Ok(role) => match role.first() {
            Some(redis::Value::BulkString(b)) if b.as_slice() == b"slave" => None,
            Some(redis::Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            other => Some(format!("{other:?}")),
        },
        Err(e) => Some(e.to_string()),
    }
}

/// What a process of the group is.
#[derive(Debug, Clone, Copy)]
enum Role {
    Master,
    /// A replica of the master on this port.
    Replica(u16),
    /// A Sentinel watching the master on this port.
    Sentinel(u16),
}

/// `SENTINEL GET-MASTER-ADDR-BY-NAME`'s port, on the Sentinel at `port`.
async fn master_of(port: u16) -> redis::RedisResult<u16> {
    let (_host, master): (String, u16) = query_port(
        port,
        redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(MASTER_NAME),
    )
    .await?;
    Ok(master)
}

/// `SENTINEL MASTER`'s fields, on the Sentinel at `port`.
async fn sentinel_master(port: u16) -> redis::RedisResult<Vec<(String, String)>> {
    let flat: Vec<String> =
        query_port(port, redis::cmd("SENTINEL").arg("MASTER").arg(MASTER_NAME)).await?;
    Ok(flat
        .chunks(2)
        .filter_map(|kv| match kv {
            [k, v] => Some((k.clone(), v.clone())),
            _ => None,
        })
        .collect())
}

/// Starts one process and waits until it answers PING. A Sentinel needs
/// a configuration file it can rewrite: it is written in `dir`.
async fn spawn_server(port: u16, role: Role, dir: &Path) -> Result<Child, String> {
    let log = dir.join(format!("redis-{port}.log"));
    let port_arg = port.to_string();
    let mut cmd = Command::new(redis_server_bin());
    if let Role::Sentinel(master) = role {
        let conf = dir.join(format!("sentinel-{port}.conf"));
        let text = format!(
            "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {log}\n\
             sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2\n\
             sentinel down-after-milliseconds {MASTER_NAME} {down}\n\
             sentinel failover-timeout {MASTER_NAME} {failover}\n\
             sentinel parallel-syncs {MASTER_NAME} 2\n",
            dir = dir.display(),
            log = log.display(),
            down = DOWN_AFTER.as_millis(),
            failover = FAILOVER_TIMEOUT.as_millis(),
        );
        std::fs::write(&conf, text).map_err(|e| format!("cannot write {}: {e}", conf.display()))?;
        cmd.arg(&conf).arg("--sentinel");
    } else {
        cmd.args(["--save", "", "--appendonly", "no", "--bind", "127.0.0.1"])
            .args(["--port", port_arg.as_str()])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(&log);
        if let Role::Replica(master) = role {
            cmd.args(["--replicaof", "127.0.0.1"])
                .arg(master.to_string());
        }
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot spawn {}: {e}", redis_server_bin()))?;
    match wait_redis_up(&mut child, port, &log, Duration::from_secs(10)).await {
        StartOutcome::Up => Ok(child),
        StartOutcome::Exited(msg) => {
            kill_and_reap(&mut child);
            Err(format!("exited: {msg}"))
        }
        StartOutcome::TimedOut => {
            kill_and_reap(&mut child);
            Err(format!("did not answer PING; log:\n{}", log_tail(&log)))
        }
    }
}
