//! The load generator: many tasks, a warm-up, a measured window, every
//! latency recorded, percentiles, and the process's CPU time per operation.

use super::error::BenchError;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How hard and how long each row is driven.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Load {
    pub(crate) concurrency: usize,
    pub(crate) warmup: Duration,
    pub(crate) duration: Duration,
}

/// What one row measured, before it is named.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    pub(crate) ops_per_s: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) ops: u64,
    /// Process CPU time (user + system, every thread) over the measured
    /// window, per operation; `None` where `/proc/self/stat` is missing.
    pub(crate) cpu_us_per_op: Option<f64>,
    /// The Redis server's CPU time per operation, where the row reads it
    /// (the gateway rows, on a Redis of this machine).
    pub(crate) store_cpu_us_per_op: Option<f64>,
    /// Every core's busy time per operation (`/proc/stat`), where the row
    /// reads it (the gateway rows driven by a process).
    pub(crate) machine_cpu_us_per_op: Option<f64>,
    /// The backend's CPU time per operation (the gateway rows: the bench
    /// process, which serves the backend).
    pub(crate) backend_cpu_us_per_op: Option<f64>,
    /// The load generator's CPU time per operation (the gateway rows
    /// driven by a process of their own).
    pub(crate) loader_cpu_us_per_op: Option<f64>,
}

/// CPU µs per request of each process a row reads.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PerRequest {
    pub(crate) proxy: Option<f64>,
    pub(crate) store: Option<f64>,
    pub(crate) backend: Option<f64>,
    pub(crate) machine: Option<f64>,
}

/// Runs `op` from `load.concurrency` tasks: a warm-up, then the measured
/// time. `op(id)` is called outside the timed part (it prepares the
/// operation, with `id` unique within the row); the future it returns is
/// the timed operation.
///
/// The CPU time is read when the measured window opens and once every task
/// has stopped, so it covers everything the process did meanwhile: the
/// load generator, the client, the guard, background work the operations
/// left (a renewal, a completion) and, in the HTTP rows, the server.
pub(crate) async fn measure<F, Fut>(load: &Load, op: F) -> Result<Sample, BenchError>
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), BenchError>> + Send + 'static,
{
    let op = Arc::new(op);
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now() + load.warmup;
    let end = start + load.duration;
    let cpu_at_start = tokio::spawn(async move {
        tokio::time::sleep_until(start.into()).await;
        cpu_time()
    });
    let mut tasks = Vec::with_capacity(load.concurrency);
    for _ in 0..load.concurrency {
        let op = Arc::clone(&op);
        let next = Arc::clone(&next);
        tasks.push(tokio::spawn(async move {
            let mut lat: Vec<u32> = Vec::with_capacity(16 * 1024);
            let mut last = start;
            loop {
                let id = next.fetch_add(1, Ordering::Relaxed);
                let fut = op(id);
                let t0 = Instant::now();
                if t0 >= end {
                    break;
                }
                fut.await?;
                let t1 = Instant::now();
                if t0 >= start {
                    lat.push(u32::try_from((t1 - t0).as_nanos()).unwrap_or(u32::MAX));
                    last = last.max(t1);
                }
                // CPU-only rows never wait: let the other tasks (and the
                // timer) run.
                tokio::task::coop::consume_budget().await;
            }
            Ok::<_, BenchError>((lat, last))
        }));
    }
    let mut all: Vec<u32> = Vec::new();
    let mut last = start;
    for t in tasks {
        let (lat, l) = t.await??;
        all.extend_from_slice(&lat);
        last = last.max(l);
    }
    let cpu_at_end = cpu_time();
    let cpu = cpu_at_start.await?.zip(cpu_at_end).map(|(a, b)| b - a);
    if all.is_empty() {
        return Err(BenchError::Empty);
    }
    all.sort_unstable();
    let elapsed = (last - start).as_secs_f64().max(1e-9);
    #[allow(clippy::cast_precision_loss)]
    let ops = all.len() as f64;
    Ok(Sample {
        ops_per_s: ops / elapsed,
        p50_us: percentile(&all, 0.50),
        p99_us: percentile(&all, 0.99),
        ops: all.len() as u64,
        cpu_us_per_op: cpu.map(|c| c.as_secs_f64() * 1e6 / ops),
        store_cpu_us_per_op: None,
        machine_cpu_us_per_op: None,
        backend_cpu_us_per_op: None,
        loader_cpu_us_per_op: None,
    })
}

/// The `p` quantile (nearest rank) of sorted nanoseconds, in microseconds.
pub(crate) fn percentile(sorted_ns: &[u32], p: f64) -> f64 {
    if sorted_ns.is_empty() {
        return 0.0;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let rank = ((p * sorted_ns.len() as f64).ceil() as usize).clamp(1, sorted_ns.len());
    f64::from(sorted_ns[rank - 1]) / 1_000.0
}

/// Clock ticks per second of `/proc/<pid>/stat` (`USER_HZ`, 100 on every
/// Linux platform the shop runs on).
const USER_HZ: u64 = 100;

/// The CPU time this process has used (user + system, all its threads,
/// including threads that have ended), from `/proc/self/stat`, in steps of
/// 10 ms. `None` off Linux.
pub(crate) fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_cpu_ticks(&stat).map(|t| Duration::from_millis(t * 1_000 / USER_HZ))
}

/// `utime + stime` (fields 14 and 15) from a `/proc/<pid>/stat` line. The
/// command name (field 2) is in parentheses and may hold spaces, so the
/// fields are counted from its closing parenthesis.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_read_after_the_command_name() {
        let line = "42 (a b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 17 0 0 20 0 3 0 9 1 1 1";
        assert_eq!(parse_cpu_ticks(line), Some(267));
        assert_eq!(parse_cpu_ticks("42 (x) S 1"), None);
    }

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let ns: Vec<u32> = (1..=100).map(|i| i * 1_000).collect();
        assert!((percentile(&ns, 0.5) - 50.0).abs() < 1e-9);
        assert!((percentile(&ns, 0.99) - 99.0).abs() < 1e-9);
        assert!((percentile(&[7_000], 0.99) - 7.0).abs() < 1e-9);
    }

    #[test]
    fn this_process_has_used_some_cpu() {
        if std::path::Path::new("/proc/self/stat").exists() {
            assert!(cpu_time().is_some());
        }
    }
}
