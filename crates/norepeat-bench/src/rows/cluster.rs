//! `fingerprint.acquire.cluster`: the `fingerprint.acquire` row on a Redis
//! Cluster, through a [`ClusterStore`] of its own (connected to the node
//! URLs given, whatever store the other rows measure).
//!
//! The claims a row's tasks make together leave as one pipeline per
//! master (see the `ClusterStore` docs); this row shows what that buys
//! beside `fingerprint.acquire` on one Redis.

use super::super::error::BenchError;
use super::super::harness::{Load, Sample};
use norepeat::store::ClusterStore;

const ROW: &str = "fingerprint.acquire.cluster";

/// A fresh fingerprint acquired and finished per operation, on the cluster
/// whose nodes are `urls` (`redis://host:port` each).
pub(crate) async fn fingerprint_acquire_cluster(
    urls: &[String],
    load: &Load,
    run: u64,
) -> Result<Sample, BenchError> {
    let store = ClusterStore::connect(urls).await?;
    // Purpose 5: apart from the other rows' fingerprints of this run.
    super::fingerprint_acquire_on(store, ROW, 5, load, run).await
}
