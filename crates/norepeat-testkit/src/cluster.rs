// Over 400 lines: one cluster and its failover helpers (start, wait for a failover, masters, kill a node), which share its ports and temp dir.
//! A local 6-node Redis Cluster (3 masters, 3 replicas).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::{
    StartOutcome, TempDir, keys_with_pttl_on, kill_and_reap, log_tail, query_port, redis_cli_bin,
    redis_server_bin, wait_redis_up,
};

/// Number of processes in the cluster.
const NODES: usize = 6;
/// How long the cluster may take to become (or become again) healthy.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(30);

/// One redis-server process of the cluster.
#[derive(Debug)]
struct Node {
    port: u16,
    child: Option<Child>,
}

/// A line of `CLUSTER NODES`, reduced to what the kit needs.
#[derive(Debug, Clone)]
struct NodeLine {
    port: u16,
    flags: Vec<String>,
    has_slots: bool,
}

impl NodeLine {
    fn parse(line: &str) -> Option<NodeLine> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 {
            return None;
        }
        // "127.0.0.1:30001@40001[,hostname]"
        let addr = fields[1].split(['@', ',']).next()?;
        let port = addr.rsplit(':').next()?.parse().ok()?;
        let flags = fields[2].split(',').map(str::to_owned).collect();
        Some(NodeLine {
            port,
            flags,
            has_slots: fields.len() > 8,
        })
    }

    fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    fn failing(&self) -> bool {
        self.has_flag("fail") || self.has_flag("fail?") || self.has_flag("noaddr")
    }

    /// A healthy master that serves at least one slot.
    fn is_serving_master(&self) -> bool {
        self.has_flag("master") && !self.failing() && self.has_slots
    }
}

/// A Redis Cluster of 6 local `redis-server` processes (3 masters with one
/// replica each), created with `redis-cli --cluster create`.
///
/// Nodes run with `--cluster-node-timeout 2000`, so a killed master is
/// replaced by its replica within a few seconds. Dropping the value kills
/// every process and removes the temporary directory.
///
/// ```no_run
/// use norepeat_testkit::RedisCluster;
///
/// # async fn demo() {
/// let mut cluster = RedisCluster::start().await;
/// assert_eq!(cluster.masters().await.len(), 3);
/// let killed_port = cluster.kill_master(0).await;
/// cluster.wait_for_failover().await;
/// assert!(!cluster.masters().await.contains(&killed_port));
/// # }
/// ```
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<Node>,
    killed: Vec<u16>,
    dir: TempDir,
}

impl RedisCluster {
    /// Starts 6 nodes on free ports, joins them into a cluster and waits
    /// until every node reports `cluster_state:ok` and every replica is
    /// linked to its master.
    ///
    /// # Panics
    ///
    /// Panics when a node cannot be started, `redis-cli --cluster create`
    /// fails, or the cluster is not healthy within 30 seconds.
    pub async fn start() -> RedisCluster {
        let dir = TempDir::new("norepeat-cluster");
        let mut cluster = RedisCluster {
            nodes: Vec::with_capacity(NODES),
            killed: Vec::new(),
            dir,
        };
        for _ in 0..NODES {
            let node = cluster.spawn_node().await;
            cluster.nodes.push(node);
        }
        cluster.create().await;
        cluster.wait_healthy(true).await;
        cluster
    }

    /// Spawns one cluster-enabled node on a free port not used by this cluster.
    async fn spawn_node(&self) -> Node {
        let mut failures = Vec::new();
        for _ in 0..5 {
            let port = loop {
                let p = crate::util::free_port();
                if !self.nodes.iter().any(|n| n.port == p) {
                    break p;
                }
            };
            match spawn_cluster_node(port, self.dir.path()).await {
                Ok(child) => {
                    return Node {
                        port,
                        child: Some(child),
                    };
                }
                Err(e) => failures.push(format!("port {port}: {e}")),
            }
        }
        panic!(
            "norepeat-testkit: cannot start a cluster node:\n{}",
            failures.join("\n")
        );
    }

    /// Runs `redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes`.
    async fn create(&self) {
        let mut cmd = tokio::process::Command::new(redis_cli_bin());
        cmd.arg("--cluster").arg("create");
        for node in &self.nodes {
            cmd.arg(format!("127.0.0.1:{}", node.port));
        }
        cmd.args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let output = match tokio::time::timeout(Duration::from_secs(60), cmd.output()).await {
            Ok(Ok(output)) => output,
            Ok(Err(e)) => panic!(
                "norepeat-testkit: cannot run {} (is redis-cli installed?): {e}",
                redis_cli_bin()
            ),
            Err(_) => panic!("norepeat-testkit: `redis-cli --cluster create` hung for 60 s"),
        };
        if !output.status.success() {
            panic!(
                "norepeat-testkit: `redis-cli --cluster create` failed ({}):\nstdout:\n{}\nstderr:\n{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }

    /// Ports of the nodes that were not killed through this handle.
    fn surviving_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.port)
            .collect()
    }

    /// Checks health once; returns a description of what is not ok yet.
    async fn health_problem(&self, check_replica_links: bool) -> Option<String> {
        for port in self.surviving_ports() {
            let info: String = match query_port(port, redis::cmd("CLUSTER").arg("INFO")).await {
                Ok(info) => info,
                Err(e) => return Some(format!("node {port}: CLUSTER INFO: {e}")),
            };
            if !info.lines().any(|l| l.trim() == "cluster_state:ok") {
                let state = info
                    .lines()
                    .find(|l| l.starts_with("cluster_state:"))
                    .unwrap_or("cluster_state:?")
                    .trim()
                    .to_owned();
                return Some(format!("node {port}: {state}"));
            }
            let lines = match cluster_nodes(port).await {
                Ok(lines) => lines,
                Err(e) => return Some(format!("node {port}: CLUSTER NODES: {e}")),
            };
            for line in &lines {
                if self.killed.contains(&line.port) && line.has_slots {
                    return Some(format!(
                        "node {port} still sees killed node {} as slot owner ({:?})",
                        line.port, line.flags
                    ));
                }
            }
            if check_replica_links {
                let repl: String =
                    match query_port(port, redis::cmd("INFO").arg("replication")).await {
                        Ok(s) => s,
                        Err(e) => return Some(format!("node {port}: INFO replication: {e}")),
                    };
                let is_replica = repl.lines().any(|l| l.trim() == "role:slave");
                if is_replica && !repl.lines().any(|l| l.trim() == "master_link_status:up") {
                    return Some(format!("replica {port}: master link not up"));
                }
            }
        }
        None
    }

    /// Waits until [`health_problem`](Self::health_problem) reports nothing.
    async fn wait_healthy(&self, check_replica_links: bool) {
        let deadline = Instant::now() + HEALTH_TIMEOUT;
        loop {
            let problem = match self.health_problem(check_replica_links).await {
                None => return,
                Some(problem) => problem,
            };
            if Instant::now() >= deadline {
                let logs: Vec<String> = self
                    .nodes
                    .iter()
                    .map(|n| {
                        let log = self.dir.path().join(format!("redis-{}.log", n.port));
                        format!("--- node {} ---\n{}", n.port, log_tail(&log))
                    })
                    .collect();
                panic!(
                    "norepeat-testkit: cluster not healthy after {HEALTH_TIMEOUT:?}: {problem}\n{}",
                    logs.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `redis+cluster://127.0.0.1:p1,127.0.0.1:p2,...` listing all 6 nodes.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// `redis://127.0.0.1:<port>` for each of the 6 nodes (killed ones included).
    pub fn node_urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect()
    }

    /// Ports of all 6 nodes (killed ones included), in start order.
    pub fn node_ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// Ports of the current masters (healthy and serving slots), sorted,
    /// as seen by the first surviving node that answers `CLUSTER NODES`.
    ///
    /// # Panics
    ///
    /// Panics when no surviving node answers.
    pub async fn masters(&self) -> Vec<u16> {
        let mut errors = Vec::new();
        for port in self.surviving_ports() {
            match cluster_nodes(port).await {
                Ok(lines) => {
                    let mut masters: Vec<u16> = lines
                        .iter()
                        .filter(|l| l.is_serving_master() && !self.killed.contains(&l.port))
                        .map(|l| l.port)
                        .collect();
                    masters.sort_unstable();
                    return masters;
                }
                Err(e) => errors.push(format!("node {port}: {e}")),
            }
        }
        panic!(
            "norepeat-testkit: no cluster node answers CLUSTER NODES: {}",
            errors.join("; ")
        );
    }

    /// SIGKILLs the master at `index` in [`masters`](Self::masters) order and
    /// returns its port.
    ///
    /// # Panics
    ///
    /// Panics when `index` is out of range.
    pub async fn kill_master(&mut self, index: usize) -> u16 {
        let masters = self.masters().await;
        let port = *masters.get(index).unwrap_or_else(|| {
            panic!("norepeat-testkit: kill_master({index}) but masters are {masters:?}")
        });
        if let Some(mut child) = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .and_then(|n| n.child.take())
        {
            kill_and_reap(&mut child);
        }
        self.killed.push(port);
        tracing::info!(port, "killed cluster master");
        port
    }

    /// Waits until every surviving node reports `cluster_state:ok` and no
    /// surviving node sees a killed master as owner of any slot (that is, a
    /// replica was promoted and took them over).
    ///
    /// # Panics
    ///
    /// Panics when this does not happen within 30 seconds.
    pub async fn wait_for_failover(&self) {
        self.wait_healthy(false).await;
    }

    /// Every key on every current master, as `(port, key, PTTL)` (-1: no
    /// expiry), found with `SCAN`.
    ///
    /// # Panics
    ///
    /// Panics when a master cannot be reached.
    pub async fn keys_with_pttl(&self) -> Vec<(u16, String, i64)> {
        let mut out = Vec::new();
        for port in self.masters().await {
            let keys = keys_with_pttl_on(port).await;
            out.extend(keys.into_iter().map(|(key, pttl)| (port, key, pttl)));
        }
        out
    }

    /// `(port, DBSIZE)` for each current master.
    ///
    /// # Panics
    ///
    /// Panics when a master cannot be reached.
    pub async fn keys_per_master(&self) -> Vec<(u16, u64)> {
        let mut out = Vec::new();
        for port in self.masters().await {
            let n: u64 = query_port(port, &redis::cmd("DBSIZE"))
                .await
                .unwrap_or_else(|e| panic!("norepeat-testkit: DBSIZE on {port}: {e}"));
            out.push((port, n));
        }
        out
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                kill_and_reap(&mut child);
            }
        }
    }
}

/// `CLUSTER NODES` on the node at `port`, parsed.
async fn cluster_nodes(port: u16) -> redis::RedisResult<Vec<NodeLine>> {
    let text: String = query_port(port, redis::cmd("CLUSTER").arg("NODES")).await?;
    Ok(text.lines().filter_map(NodeLine::parse).collect())
}

/// Spawns a cluster-enabled redis-server on `port` and waits for PING.
async fn spawn_cluster_node(port: u16, dir: &Path) -> Result<Child, String> {
    let log = dir.join(format!("redis-{port}.log"));
    let port_arg = port.to_string();
    let mut child = Command::new(redis_server_bin())
        .args(["--port", port_arg.as_str(), "--bind", "127.0.0.1"])
        .args(["--cluster-enabled", "yes"])
        .arg("--cluster-config-file")
        .arg(format!("nodes-{port}.conf"))
        .args(["--cluster-node-timeout", "2000"])
        .args(["--appendonly", "no", "--save", ""])
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
    match wait_redis_up(&mut child, port, &log, Duration::from_secs(10)).await {
        StartOutcome::Up => Ok(child),
        StartOutcome::Exited(msg) => {
            kill_and_reap(&mut child);
            Err(format!("redis-server exited: {msg}"))
        }
        StartOutcome::TimedOut => {
            kill_and_reap(&mut child);
            Err(format!(
                "cluster node did not answer PING; log:\n{}",
                log_tail(&log)
            ))
        }
    }
}
