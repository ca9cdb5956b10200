//! `fingerprint.acquire.cluster`: the `fingerprint.acquire` row on a Redis
//! Cluster, through a [`ClusterStore`] of its own (connected to the node
//! URLs given, whatever store the other rows measure).
//!
//! The claims a row's tasks make together leave as one pipeline per
//! master (see the `ClusterStore` docs); this row shows what that buys
//! beside `fingerprint.acquire` on one Redis.

use super::super::BenchError;
use super::super::harness::{Load, Sample, measure};
use super::fingerprint;
use norepeat::fingerprint::FingerprintGuard;
use norepeat::problem::Problem;
use norepeat::store::ClusterStore;
use std::sync::Arc;

const ROW: &str = "fingerprint.acquire.cluster";

/// A fresh fingerprint acquired and finished per operation, on the cluster
/// whose nodes are `urls` (`redis://host:port` each).
pub(crate) async fn fingerprint_acquire_cluster(
    urls: &[String],
    load: &Load,
    run: u64,
) -> Result<Sample, BenchError> {
    let store = ClusterStore::connect(urls).await?;
    let guard = Arc::new(FingerprintGuard::new(store));
    measure(load, move |id| {
        let g = Arc::clone(&guard);
        // Purpose 5: apart from the other rows' fingerprints of this run.
        let fp = fingerprint(run, 5, id);
        async move {
            let lease = g.acquire(&fp).await.map_err(|p| {
                BenchError::unexpected(ROW, format!("refused: {}", Problem::from(p).code.as_str()))
            })?;
            if !lease.is_held() {
                return Err(BenchError::unexpected(
                    ROW,
                    "the store failed (admitted fail-open)",
                ));
            }
            lease.finish(true).await;
            Ok(())
        }
    })
    .await
}
