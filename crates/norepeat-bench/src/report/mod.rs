// Over 400 lines on purpose: one run's figures as the table and the JSON object the contract gives (390 lines), with their unit tests beside them; the goals are in goals.rs.
//! What one run found, as a table for people and one JSON object for
//! machines (the shape `norepeat bench --json` has always had).

mod goals;

use serde::Serialize;
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::time::Duration;

/// One row of the report.
#[derive(Debug, Clone, Serialize)]
pub struct BenchResult {
    /// What was measured (see the module docs).
    pub name: &'static str,
    /// Operations completed per second over the measured time.
    pub ops_per_s: f64,
    /// Median latency of one operation, in microseconds.
    pub p50_us: f64,
    /// 99th-percentile latency, in microseconds.
    pub p99_us: f64,
    /// Operations measured.
    pub ops: u64,
    /// The process's CPU time (user + system, all threads) over the
    /// measured window, per operation, in microseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_us_per_op: Option<f64>,
    /// The Redis server's CPU time per operation, over the same window
    /// (the gateway rows, when that server runs on this machine).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store_cpu_us_per_op: Option<f64>,
    /// Every core's busy time per operation, over the same window (the
    /// gateway rows driven by a load-generator process).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machine_cpu_us_per_op: Option<f64>,
    /// The backend's CPU time per operation (the gateway rows: the bench
    /// process, which serves it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend_cpu_us_per_op: Option<f64>,
    /// The load generator's CPU time per operation (the gateway rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loader_cpu_us_per_op: Option<f64>,
    /// With `--rounds N` (N > 1), the lowest and highest `ops_per_s` over
    /// the rounds; every other figure of the row is then the median of
    /// the rounds'.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ops_per_s_range: Option<[f64; 2]>,
}

impl BenchResult {
    /// Row `name`'s result from what it measured.
    pub(crate) fn of(name: &'static str, s: &crate::harness::Sample) -> Self {
        Self {
            name,
            ops_per_s: s.ops_per_s,
            p50_us: s.p50_us,
            p99_us: s.p99_us,
            ops: s.ops,
            cpu_us_per_op: s.cpu_us_per_op,
            store_cpu_us_per_op: s.store_cpu_us_per_op,
            machine_cpu_us_per_op: s.machine_cpu_us_per_op,
            backend_cpu_us_per_op: s.backend_cpu_us_per_op,
            loader_cpu_us_per_op: s.loader_cpu_us_per_op,
            ops_per_s_range: None,
        }
    }

    /// The median over rounds of each figure of row `name` (`None` when
    /// no round measured it), with the range of `ops_per_s`.
    fn median_of(name: &'static str, rounds: &[Vec<Self>]) -> Option<Self> {
        let runs: Vec<&Self> = rounds
            .iter()
            .filter_map(|r| r.iter().find(|b| b.name == name))
            .collect();
        let first = *runs.first()?;
        let of = |f: fn(&Self) -> Option<f64>| median(runs.iter().filter_map(|r| f(r)));
        let ops: Vec<f64> = runs.iter().map(|r| r.ops_per_s).collect();
        Some(Self {
            name,
            ops_per_s: median(ops.iter().copied())?,
            p50_us: of(|r| Some(r.p50_us))?,
            p99_us: of(|r| Some(r.p99_us))?,
            ops: first.ops,
            cpu_us_per_op: of(|r| r.cpu_us_per_op),
            store_cpu_us_per_op: of(|r| r.store_cpu_us_per_op),
            machine_cpu_us_per_op: of(|r| r.machine_cpu_us_per_op),
            backend_cpu_us_per_op: of(|r| r.backend_cpu_us_per_op),
            loader_cpu_us_per_op: of(|r| r.loader_cpu_us_per_op),
            ops_per_s_range: (runs.len() > 1).then(|| range(&ops)),
        })
    }
}

/// The median of `values` (the mean of the middle two for an even count);
/// `None` for none.
pub(crate) fn median(values: impl Iterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len().is_multiple_of(2) {
        f64::midpoint(v[mid - 1], v[mid])
    } else {
        v[mid]
    })
}

/// The lowest and the highest of `values` (not empty).
fn range(values: &[f64]) -> [f64; 2] {
    values
        .iter()
        .fold([f64::INFINITY, f64::NEG_INFINITY], |[lo, hi], &x| {
            [lo.min(x), hi.max(x)]
        })
}

/// Redis memory per key, each the settled growth of `used_memory` over
/// the keys written.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryResult {
    /// A fingerprint key written through the guard.
    pub bytes_per_fingerprint_key: f64,
    /// An `Idempotency-Key` record claimed through the layer, its handler
    /// still running.
    pub bytes_per_idempotency_in_progress: f64,
    /// The same record completed with a 64-byte JSON body (and its
    /// `content-type`).
    pub bytes_per_idempotency_completed: f64,
    /// Keys (and records) written for each figure.
    pub keys: u64,
    /// Keys the server gained while the fingerprint keys were written
    /// (`DBSIZE`): a check that nothing else wrote or expired much.
    pub dbsize_delta: i64,
    /// Where it was measured.
    pub server: String,
}

/// The `redis-benchmark` ceiling: `SET key v NX PX 3000`, 64 clients, 16
/// commands pipelined, on fresh keys (the work of a claim) and on one key
/// (each refused after the first: the work of a duplicate).
#[derive(Debug, Clone, Serialize)]
pub struct Ceiling {
    /// The command line of the fresh-key run.
    pub command: String,
    /// Requests per second it reported: the ceiling.
    pub ops_per_s: f64,
    /// Keys the server gained over the fresh-key run (`DBSIZE`): about
    /// one per request.
    pub keys_gained: i64,
    /// The command line of the one-key run.
    pub one_key_command: String,
    /// Requests per second the one-key run reported.
    pub one_key_ops_per_s: f64,
}

/// What one run found.
#[derive(Debug)]
pub struct Report {
    pub(crate) store: &'static str,
    pub(crate) url: Option<String>,
    pub(crate) concurrency: usize,
    pub(crate) duration: Duration,
    /// Each row's result: with `--rounds N` (N > 1), the median of its
    /// rounds'.
    pub(crate) results: Vec<BenchResult>,
    /// Every round's results, in the order run (one round without
    /// `--rounds`).
    pub(crate) rounds: Vec<Vec<BenchResult>>,
    pub(crate) memory: Result<MemoryResult, String>,
    pub(crate) ceiling: Result<Ceiling, String>,
}

impl Report {
    /// The report of `rounds` (each the rows in the order run), with each
    /// row's median.
    pub(crate) fn of_rounds(
        head: (&'static str, Option<String>, usize, Duration),
        rounds: Vec<Vec<BenchResult>>,
        memory: Result<MemoryResult, String>,
        ceiling: Result<Ceiling, String>,
    ) -> Self {
        let (store, url, concurrency, duration) = head;
        let results = match rounds.as_slice() {
            [one] => one.clone(),
            _ => {
                let mut names: Vec<&'static str> = Vec::new();
                for r in rounds.iter().flatten() {
                    if !names.contains(&r.name) {
                        names.push(r.name);
                    }
                }
                names
                    .into_iter()
                    .filter_map(|n| BenchResult::median_of(n, &rounds))
                    .collect()
            }
        };
        Self {
            store,
            url,
            concurrency,
            duration,
            results,
            rounds,
            memory,
            ceiling,
        }
    }

    fn on_redis(&self) -> bool {
        self.store != "memory"
    }

    /// The machine-readable report.
    #[must_use]
    pub fn to_json(&self) -> Value {
        let mut out = json!({
            "store": self.store,
            "concurrency": self.concurrency,
            "duration_ms": u64::try_from(self.duration.as_millis()).unwrap_or(u64::MAX),
            "results": self.results,
            "memory": self.memory.as_ref().ok(),
            "ceiling": match &self.ceiling {
                Ok(c) => json!(c),
                Err(why) => json!({ "skipped": why }),
            },
        });
        if let Err(why) = &self.memory
            && self.on_redis()
        {
            out["memory_skipped"] = json!(why);
        }
        if self.on_redis() {
            let ratios: serde_json::Map<String, Value> = self
                .goals()
                .into_iter()
                .filter_map(|g| Some((g.json?.to_owned(), json!(g.value))))
                .collect();
            out["ratios"] = Value::Object(ratios);
        } else {
            // The gateway's ratios, and the replicas' (on a pair of the
            // bench's own), are measured on any store.
            let ratios: serde_json::Map<String, Value> = self
                .goals()
                .into_iter()
                .filter_map(|g| Some((g.json?.to_owned(), json!(g.value?))))
                .filter(|(k, _)| k.starts_with("gateway_") || k.starts_with("replicas"))
                .collect();
            out["ratios"] = Value::Object(ratios);
        }
        if self.rounds.len() > 1 {
            let ranges: serde_json::Map<String, Value> = self
                .goals()
                .into_iter()
                .filter_map(|g| Some((g.json?.to_owned(), json!(g.range?))))
                .collect();
            out["rounds"] = json!(self.rounds.len());
            out["ratio_ranges"] = Value::Object(ranges);
            out["round_results"] = json!(self.rounds);
        }
        out
    }

    /// The table for people.
    #[must_use]
    pub fn table(&self) -> String {
        let mut out = String::new();
        let url = self
            .url
            .as_deref()
            .map(|u| format!(" ({u})"))
            .unwrap_or_default();
        let rounds = match self.rounds.len() {
            0 | 1 => String::new(),
            n => format!(", {n} rounds (each figure the median of its rounds')"),
        };
        let _ = writeln!(
            out,
            "norepeat bench: store {}{url}, {} concurrent tasks, {:.1} s per row{rounds}\n",
            self.store,
            self.concurrency,
            self.duration.as_secs_f64()
        );
        // CPU µs per operation of each process: `cpu` is the bench
        // process's (the library rows) or the proxy's (the gateway rows).
        let _ = writeln!(
            out,
            "{:<32} {:>10} {:>17} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "name",
            "ops/s",
            "ops/s range",
            "p50 µs",
            "p99 µs",
            "cpu",
            "backend",
            "redis",
            "loader",
            "machine"
        );
        let or_dash = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |c| format!("{c:.2}"));
        for r in &self.results {
            let range = r
                .ops_per_s_range
                .map_or_else(|| "-".to_owned(), |[lo, hi]| format!("{lo:.0}-{hi:.0}"));
            let _ = writeln!(
                out,
                "{:<32} {:>10.0} {:>17} {:>9.1} {:>9.1} {:>9} {:>9} {:>9} {:>9} {:>9}",
                r.name,
                r.ops_per_s,
                range,
                r.p50_us,
                r.p99_us,
                or_dash(r.cpu_us_per_op),
                or_dash(r.backend_cpu_us_per_op),
                or_dash(r.store_cpu_us_per_op),
                or_dash(r.loader_cpu_us_per_op),
                or_dash(r.machine_cpu_us_per_op)
            );
        }
        let _ = writeln!(out);
        match &self.ceiling {
            Ok(c) => {
                let _ = writeln!(
                    out,
                    "ceiling: {:.0} ops/s, {} keys created  ({})",
                    c.ops_per_s, c.keys_gained, c.command
                );
                let _ = writeln!(
                    out,
                    "one key (refused after the first): {:.0} ops/s  ({})",
                    c.one_key_ops_per_s, c.one_key_command
                );
            }
            Err(why) => _ = writeln!(out, "ceiling: {why}"),
        }
        match &self.memory {
            Ok(m) => {
                let _ = writeln!(
                    out,
                    "memory ({}; {} keys each, DBSIZE +{} for the fingerprints): {:.1} B per fingerprint key, {:.1} B per idempotency record in progress, {:.1} B completed",
                    m.server,
                    m.keys,
                    m.dbsize_delta,
                    m.bytes_per_fingerprint_key,
                    m.bytes_per_idempotency_in_progress,
                    m.bytes_per_idempotency_completed
                );
            }
            Err(why) => _ = writeln!(out, "memory: {why}"),
        }
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<44} {:>22}  {:<12} result",
            "goal", "value", "target"
        );
        for g in self.goals() {
            let value = g.value.map_or_else(
                || "-".to_owned(),
                |v| {
                    if v >= 1_000.0 {
                        format!("{v:.0}")
                    } else {
                        format!("{v:.2}")
                    }
                },
            );
            let value = match g.range {
                Some([lo, hi]) => format!("{value} ({lo:.2}-{hi:.2})"),
                None => value,
            };
            let met = match g.met() {
                Some(true) => "met",
                Some(false) => "MISSED",
                None if g.value.is_some() => "",
                None => "not measured",
            };
            let _ = writeln!(
                out,
                "{:<44} {:>22}  {:<12} {met}",
                g.name,
                value,
                g.target_text()
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::goals::ceiling;
    use super::*;

    fn row(name: &'static str, store: Option<f64>, machine: Option<f64>) -> BenchResult {
        BenchResult {
            name,
            ops_per_s: 1.0,
            p50_us: 1.0,
            p99_us: 1.0,
            ops: 1,
            cpu_us_per_op: None,
            store_cpu_us_per_op: store,
            machine_cpu_us_per_op: machine,
            backend_cpu_us_per_op: None,
            loader_cpu_us_per_op: None,
            ops_per_s_range: None,
        }
    }

    fn report(results: Vec<BenchResult>) -> Report {
        rounds(vec![results])
    }

    fn rounds(rounds: Vec<Vec<BenchResult>>) -> Report {
        Report::of_rounds(
            ("redis", None, 64, Duration::from_secs(1)),
            rounds,
            Err("not measured".to_owned()),
            Err("not measured".to_owned()),
        )
    }

    /// NGINX's POST costs the machine 30 µs; the guarded request's Redis
    /// 5 µs more: at most 30 / 35 of NGINX's rate.
    #[test]
    fn the_ceiling_is_nginx_machine_time_over_it_plus_the_store_time() {
        let r = report(vec![
            row("gateway.nginx_post", None, Some(30.0)),
            row("gateway.guarded", Some(5.0), Some(40.0)),
            row("gateway.idempotency", None, Some(50.0)),
        ]);
        let c = ceiling(&r.results, "gateway.guarded").unwrap();
        assert!((c - 30.0 / 35.0).abs() < 1e-12, "{c}");
        // Without the store's figure (a Redis elsewhere), none.
        assert_eq!(ceiling(&r.results, "gateway.idempotency"), None);
        let json = r.to_json();
        assert!(json["ratios"]["gateway_guarded_ceiling"].as_f64().is_some());
        assert!(json["ratios"]["gateway_idempotency_ceiling"].is_null());
        // Without NGINX's, none either.
        let r = report(vec![row("gateway.guarded", Some(5.0), Some(40.0))]);
        assert_eq!(ceiling(&r.results, "gateway.guarded"), None);
    }

    fn rate(name: &'static str, ops_per_s: f64, cpu: f64) -> BenchResult {
        BenchResult {
            ops_per_s,
            cpu_us_per_op: Some(cpu),
            ..row(name, None, None)
        }
    }

    /// Over rounds, a ratio is the median of each round's ratio (its two
    /// rows ran side by side), not the ratio of the rows' medians; each
    /// row's figures are their medians, with the range of its rate.
    #[test]
    fn rounds_give_the_median_of_each_rounds_ratio() {
        let r = rounds(vec![
            vec![
                rate("gateway.passthrough", 10.0, 4.0),
                rate("gateway.nginx", 5.0, 2.0),
            ],
            vec![
                rate("gateway.passthrough", 20.0, 6.0),
                rate("gateway.nginx", 40.0, 2.0),
            ],
            vec![
                rate("gateway.passthrough", 30.0, 5.0),
                rate("gateway.nginx", 20.0, 5.0),
            ],
        ]);
        let json = r.to_json();
        assert_eq!(json["rounds"], 3);
        let ratio = json["ratios"]["gateway_passthrough_over_nginx"]
            .as_f64()
            .unwrap();
        assert!((ratio - 1.5).abs() < 1e-12, "{json}");
        assert_eq!(
            json["ratio_ranges"]["gateway_passthrough_over_nginx"],
            serde_json::json!([0.5, 2.0])
        );
        // CPU per request: 2.0, 3.0 and 1.0 of NGINX's.
        let cpu = json["ratios"]["gateway_passthrough_cpu_over_nginx"]
            .as_f64()
            .unwrap();
        assert!((cpu - 2.0).abs() < 1e-12, "{json}");
        let pass = &r.results[0];
        assert_eq!(pass.name, "gateway.passthrough");
        assert!((pass.ops_per_s - 20.0).abs() < 1e-12);
        assert_eq!(pass.ops_per_s_range, Some([10.0, 30.0]));
        assert_eq!(pass.cpu_us_per_op, Some(5.0));
        assert_eq!(json["round_results"].as_array().map(Vec::len), Some(3));
        assert!(r.table().contains("3 rounds"), "{}", r.table());
    }

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median([4.0, 1.0, 3.0, 2.0].into_iter()), Some(2.5));
        assert_eq!(median([7.0].into_iter()), Some(7.0));
        assert_eq!(median(std::iter::empty()), None);
    }
}
