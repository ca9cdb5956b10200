//! The CPU time each process of a gateway row spends, from `/proc`: the
//! proxy (its process and its children: NGINX's master and workers), the
//! Redis server, the backend (this process alone) and every core's busy
//! time.

use crate::harness::PerRequest;
use std::time::Duration;

/// The processes whose CPU time a row reads.
pub(super) struct Clocks {
    /// The proxy, with its child processes.
    pub(super) proxy: Option<u32>,
    /// The Redis server, when it runs on this machine.
    pub(super) store: Option<u32>,
    /// The backend's process alone (this one: its children are the proxy
    /// and the load generator).
    pub(super) backend: Option<u32>,
}

/// The CPU time a row's work took: the proxy's, the store's, the
/// backend's, and every core's busy time.
pub(super) struct Spent {
    pub(super) proxy: Option<Duration>,
    pub(super) store: Option<Duration>,
    pub(super) backend: Option<Duration>,
    pub(super) machine: Option<Duration>,
}

impl Spent {
    /// Each per request, in microseconds.
    pub(super) fn per(&self, requests: f64) -> PerRequest {
        let per = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1e6 / requests);
        PerRequest {
            proxy: per(self.proxy),
            store: per(self.store),
            backend: per(self.backend),
            machine: per(self.machine),
        }
    }
}

/// Runs `work` and the CPU time spent meanwhile.
pub(super) async fn with_cpu<T>(clocks: &Clocks, work: impl Future<Output = T>) -> (T, Spent) {
    let read = || {
        (
            clocks.proxy.and_then(process_cpu),
            clocks.store.and_then(process_cpu),
            clocks.backend.and_then(one_process_cpu),
            machine_busy(),
        )
    };
    let before = read();
    let out = work.await;
    let after = read();
    let spent =
        |b: Option<Duration>, a: Option<Duration>| b.zip(a).map(|(b, a)| a.saturating_sub(b));
    (
        out,
        Spent {
            proxy: spent(before.0, after.0),
            store: spent(before.1, after.1),
            backend: spent(before.2, after.2),
            machine: spent(before.3, after.3),
        },
    )
}

/// Every core's busy time since boot: the first line of `/proc/stat`
/// (`cpu  user nice system idle iowait irq softirq steal ...`, in clock
/// ticks of 10 ms), all but `idle` and `iowait`.
fn machine_busy() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    busy_ticks(stat.lines().next()?).map(|t| Duration::from_millis(t * 10))
}

fn busy_ticks(line: &str) -> Option<u64> {
    let mut fields = line.strip_prefix("cpu ")?.split_whitespace();
    let mut next = || fields.next()?.parse::<u64>().ok();
    let (user, nice, system, _idle, _iowait) = (next()?, next()?, next()?, next()?, next()?);
    let (irq, softirq, steal) = (next()?, next()?, next()?);
    Some(user + nice + system + irq + softirq + steal)
}

/// User + system CPU time of process `pid` (all its threads) and of its
/// child processes (nginx's workers), from `/proc/PID/stat`.
pub(crate) fn process_cpu(pid: u32) -> Option<Duration> {
    let own = one_process_cpu(pid)?;
    let children = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&child| parent_of(child) == Some(pid))
        .filter_map(one_process_cpu)
        .sum::<Duration>();
    Some(own + children)
}

/// The parent process id of `pid` (`/proc/PID/stat`, field 4).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = stat.get(stat.rfind(')')? + 2..)?;
    after_name.split(' ').nth(1)?.parse().ok()
}

/// User + system CPU time of process `pid` alone (all its threads), from
/// `/proc/PID/stat` (fields 14 and 15, counted after the command name,
/// which is in parentheses and may hold spaces), in clock ticks of 10 ms.
fn one_process_cpu(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = after_name.split(' ').collect();
    // After the name: state is field 3, so utime (14) is at index 11.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn busy_time_leaves_idle_and_iowait_out() {
        let line = "cpu  100 2 30 5000 7 1 4 3 0 0";
        assert_eq!(busy_ticks(line), Some(100 + 2 + 30 + 1 + 4 + 3));
        assert_eq!(busy_ticks("cpu0 1 2 3 4 5 6 7 8"), None);
        assert_eq!(busy_ticks("cpu  1 2"), None);
        assert!(machine_busy().is_some_and(|d| d > Duration::ZERO));
    }

    #[test]
    fn cpu_time_is_read_after_the_command_name() {
        let me = process_cpu(std::process::id());
        if Path::new("/proc/self/stat").exists() {
            assert!(me.is_some());
            assert!(one_process_cpu(std::process::id()).is_some());
        }
        assert_eq!(process_cpu(u32::MAX), None);
    }
}
