//! Redis Cluster.

use super::single::at;
use super::{Backend, Scripts, map_err};
use crate::store::{StoreError, redact_url};
use redis::cluster_async::ClusterConnection;
use std::sync::Arc;
use std::time::Duration;

/// A Redis Cluster. Every operation (each command, each Lua script)
/// touches exactly one key, so it runs in that key's slot and needs no hash
/// tag; redirections (MOVED, ASK) and failovers
/// are followed by the cluster client, and scripts are loaded again on a new
/// master that answers NOSCRIPT.
///
/// What the client (redis-rs cluster-async) does during a failover, and how
/// it is configured here:
/// - `MOVED`/`ASK`: followed at once (a `MOVED` also refreshes the slot map).
/// - `READONLY` (a write on a master demoted to replica): slot map refreshed,
///   command retried on the new master.
/// - `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`: retried after a short backoff
///   (10 ms rising to 500 ms here; the client's default waits 1.28 s before
///   every such retry, longer than any guard's budget).
/// - a refused or dropped connection: reconnected, retried, and the slot map
///   refreshed.
///
/// At most 6 retries, and 2 s per call in all (connecting: 1 s). Put the
/// store behind [`Resilient`](crate::store::Resilient) for a guard's much
/// shorter budget and a breaker, and behind
/// [`Fallback`](crate::store::Fallback) for fail-open routes: while a
/// master's slots have no master (a few seconds, set by
/// `cluster-node-timeout`), calls on them fail and the route's policy
/// applies; calls on other slots are unaffected.
///
/// `NOSCRIPT`: Redis does not replicate `SCRIPT LOAD` (checked on 7.0), so a
/// promoted replica may lack the scripts; the first call there loads them
/// (`SCRIPT LOAD` on every node) and runs again.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), norepeat::store::StoreError> {
/// let store = norepeat::store::ClusterStore::connect(&[
///     "redis://127.0.0.1:7000", "redis://127.0.0.1:7001", "redis://127.0.0.1:7002",
/// ]).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ClusterStore(Backend<ClusterConnection>);

impl std::fmt::Debug for ClusterStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterStore")
    }
}

impl ClusterStore {
    /// Connects to the cluster that `nodes` (`redis://host:port` each) belong to.
    ///
    /// # Errors
    /// When no node can be reached or a URL is invalid.
    pub async fn connect<S: AsRef<str>>(nodes: &[S]) -> Result<Self, StoreError> {
        let nodes: Vec<&str> = nodes.iter().map(AsRef::as_ref).collect();
        let shown = nodes
            .iter()
            .map(|n| redact_url(n))
            .collect::<Vec<_>>()
            .join(",");
        let client = redis::cluster::ClusterClientBuilder::new(nodes)
            .connection_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(2))
            .retries(6)
            .min_retry_wait(10)
            .max_retry_wait(500)
            .retry_wait_formula(20, 2)
            .build()
            .map_err(|e| {
                StoreError::InvalidUrl(format!(
                    "{shown:?} ({e}); a node's URL looks like redis://[[user]:password@]host:port"
                ))
            })?;
        let con = client
            .get_async_connection()
            .await
            .map_err(|e| at(&shown, map_err(e)))?;
        Ok(Self(Backend {
            con,
            scripts: Arc::new(Scripts::new()),
        }))
    }
}

impl_store!(ClusterStore, "cluster");
