//! `fingerprint.acquire.replicas0` and `fingerprint.acquire.replicas1`:
//! the `fingerprint.acquire` row on a master with one replica linked to it
//! (two `redis-server`s the bench starts, [`ReplicaPair`]), through a store made
//! from its URL with `?replicas=0` and with `?replicas=1`.
//!
//! With `replicas=1` each batch of claims ends with `WAIT 1`, in the same
//! pipeline: a claim is answered once the replica has it. The two rows,
//! side by side on one pair, are what that costs: claims per second and
//! each claim's time.

use super::super::error::BenchError;
use super::super::harness::{Load, Sample};
use super::super::private_redis::PrivateRedis;
use norepeat::store::AnyStore;
use std::time::Duration;

/// A master and a replica linked to it, each a `redis-server` of the
/// bench's own on loopback, stopped when dropped.
pub(crate) struct ReplicaPair {
    master: PrivateRedis,
    replica: PrivateRedis,
}

impl ReplicaPair {
    /// Starts both, links the replica (`REPLICAOF`) and waits until the
    /// link is up; or says why not.
    pub(crate) async fn start() -> Result<Self, BenchError> {
        let master = PrivateRedis::start().await?;
        let replica = PrivateRedis::start().await?;
        let port = master.url.rsplit(':').next().unwrap_or_default().to_owned();
        let mut con = redis::Client::open(replica.url.as_str())?
            .get_multiplexed_async_connection()
            .await?;
        let () = redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(&port)
            .query_async(&mut con)
            .await?;
        for _ in 0..200 {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut con)
                .await?;
            if info.contains("master_link_status:up") {
                return Ok(Self { master, replica });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(BenchError::Probe(format!(
            "the replica of {} did not link up within 10 s",
            master.url
        )))
    }

    /// The CPU time the master and the replica have used so far.
    fn cpu(&self) -> Option<Duration> {
        let of = |r: &PrivateRedis| super::gateway::process_cpu(r.pid()?);
        Some(of(&self.master)? + of(&self.replica)?)
    }
}

/// The row `name` (`...replicas0` or `...replicas1`) on `pair`'s master.
/// The Redis column is the master's and the replica's CPU time together,
/// over the row's warm-up and measured time, per operation at the
/// measured rate.
pub(crate) async fn fingerprint_acquire_replicas(
    name: &'static str,
    pair: &ReplicaPair,
    load: &Load,
    run: u64,
) -> Result<Sample, BenchError> {
    let (count, purpose) = if name.ends_with("replicas1") {
        (1, 7)
    } else {
        (0, 6)
    };
    // A second for the replica's acknowledgement: a claim it did not
    // acknowledge in time ends the row with an error, not a faster figure.
    let url = format!("{}?replicas={count}&replicas_timeout=1s", pair.master.url);
    let store = AnyStore::from_url(Some(&url)).await?;
    let (began, cpu_before) = (std::time::Instant::now(), pair.cpu());
    let mut sample = super::fingerprint_acquire_on(store, name, purpose, load, run).await?;
    let ops = sample.ops_per_s * began.elapsed().as_secs_f64();
    sample.store_cpu_us_per_op = cpu_before
        .zip(pair.cpu())
        .map(|(before, after)| after.saturating_sub(before).as_secs_f64() * 1e6 / ops.max(1.0));
    Ok(sample)
}
