// Over 400 lines on purpose: what one run found, as the table and the JSON object the contract gives, the ratios and their goals in one place.
//! What one run found, as a table for people and one JSON object for
//! machines (the shape `norepeat bench --json` has always had).

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
    pub(crate) results: Vec<BenchResult>,
    pub(crate) memory: Result<MemoryResult, String>,
    pub(crate) ceiling: Result<Ceiling, String>,
}

/// A figure against its target (issues 15, 26 and 28).
struct Goal {
    name: &'static str,
    /// The key under `ratios` in the JSON, for ratios.
    json: Option<&'static str>,
    value: Option<f64>,
    target: &'static str,
    met: Option<bool>,
}

impl Report {
    fn result(&self, name: &str) -> Option<&BenchResult> {
        self.results.iter().find(|r| r.name == name)
    }

    fn ops(&self, name: &str) -> Option<f64> {
        self.result(name).map(|r| r.ops_per_s)
    }

    fn over(&self, a: &str, b: &str) -> Option<f64> {
        self.ops(a).zip(self.ops(b)).map(|(a, b)| a / b)
    }

    /// The most `row` could reach against `gateway.nginx_post` if its
    /// proxy cost no more CPU than NGINX's: NGINX's request costs the
    /// machine `m` µs of busy time (generator, backend, proxy), `row`'s
    /// adds at least the `s` µs its Redis server spends, so on cores all
    /// of them share the ratio is at most `m / (m + s)`.
    fn ceiling(&self, row: &str) -> Option<f64> {
        let m = self.result("gateway.nginx_post")?.machine_cpu_us_per_op?;
        let s = self.result(row)?.store_cpu_us_per_op?;
        Some(m / (m + s))
    }

    fn goals(&self) -> Vec<Goal> {
        let at_least = |v: Option<f64>, t: f64| v.map(|v| v >= t);
        let at_most = |v: Option<f64>, t: f64| v.map(|v| v <= t);
        let fp = self.over("fingerprint.acquire", "redis.raw");
        let token = self.over("token.consume", "redis.raw");
        let http = self.over("http.guarded", "http.unguarded");
        let ceiling = self.ceiling.as_ref().ok().map(|c| c.ops_per_s);
        let one_key = self.ceiling.as_ref().ok().map(|c| c.one_key_ops_per_s);
        let duplicate_one_key = self
            .ops("fingerprint.duplicate")
            .zip(one_key)
            .map(|(r, c)| r / c);
        let raw_ceiling = self.ops("redis.raw").zip(ceiling).map(|(r, c)| r / c);
        let fp_ceiling = self
            .ops("fingerprint.acquire")
            .zip(ceiling)
            .map(|(r, c)| r / c);
        let handrolled = self.over("http.guarded", "http.handrolled");
        let cycle_store = self.over("idempotency.cycle", "idempotency.store_cycle");
        let replay_raw = self.over("idempotency.replay", "redis.raw");
        let mem = self.memory.as_ref().ok();
        let fp_bytes = mem.map(|m| m.bytes_per_fingerprint_key);
        let in_progress = mem.map(|m| m.bytes_per_idempotency_in_progress);
        let completed = mem.map(|m| m.bytes_per_idempotency_completed);
        let claim = self.ops("idempotency.claim");
        let cycle = self.ops("idempotency.cycle");
        vec![
            Goal {
                name: "fingerprint.acquire / redis.raw",
                json: Some("fingerprint_acquire_over_raw"),
                value: fp,
                target: ">= 0.95",
                met: at_least(fp, 0.95),
            },
            Goal {
                name: "token.consume / redis.raw",
                json: Some("token_consume_over_raw"),
                value: token,
                target: ">= 0.95",
                met: at_least(token, 0.95),
            },
            Goal {
                name: "http.guarded / http.unguarded",
                json: Some("http_guarded_over_unguarded"),
                value: http,
                target: "(reference)",
                met: None,
            },
            Goal {
                name: "http.guarded / http.handrolled",
                json: Some("http_guarded_over_handrolled"),
                value: handrolled,
                target: ">= 0.95",
                met: at_least(handrolled, 0.95),
            },
            Goal {
                name: "idempotency.cycle / idempotency.store_cycle",
                json: Some("idempotency_cycle_over_store_cycle"),
                value: cycle_store,
                target: ">= 0.75",
                met: at_least(cycle_store, 0.75),
            },
            Goal {
                name: "idempotency.replay / redis.raw",
                json: Some("idempotency_replay_over_raw"),
                value: replay_raw,
                target: ">= 0.9",
                met: at_least(replay_raw, 0.9),
            },
            Goal {
                name: "fingerprint.acquire / redis-benchmark ceiling",
                json: Some("fingerprint_acquire_over_ceiling"),
                value: fp_ceiling,
                target: ">= 0.4",
                met: at_least(fp_ceiling, 0.4),
            },
            Goal {
                name: "redis.raw / redis-benchmark ceiling",
                json: Some("raw_over_ceiling"),
                value: raw_ceiling,
                target: "(reference)",
                met: None,
            },
            Goal {
                name: "fingerprint.duplicate / one-key ceiling",
                json: Some("fingerprint_duplicate_over_one_key_ceiling"),
                value: duplicate_one_key,
                target: "(reference)",
                met: None,
            },
            Goal {
                name: "bytes per fingerprint key",
                json: None,
                value: fp_bytes,
                target: "<= 120",
                met: at_most(fp_bytes, 120.0),
            },
            Goal {
                name: "bytes per idempotency record in progress",
                json: None,
                value: in_progress,
                target: "<= 150",
                met: at_most(in_progress, 150.0),
            },
            Goal {
                name: "bytes per completed record (64 B body)",
                json: None,
                value: completed,
                target: "<= 250",
                met: at_most(completed, 250.0),
            },
            Goal {
                name: "idempotency.claim ops/s",
                json: None,
                value: claim,
                target: ">= 150000",
                met: at_least(claim, 150_000.0),
            },
            Goal {
                name: "idempotency.cycle ops/s",
                json: None,
                value: cycle,
                target: ">= 60000",
                met: at_least(cycle, 60_000.0),
            },
            Goal {
                name: "gateway.passthrough / gateway.direct",
                json: Some("gateway_passthrough_over_direct"),
                value: self.over("gateway.passthrough", "gateway.direct"),
                target: "(reference)",
                met: None,
            },
            Goal {
                name: "gateway.passthrough / gateway.nginx",
                json: Some("gateway_passthrough_over_nginx"),
                value: self.over("gateway.passthrough", "gateway.nginx"),
                target: ">= 1.0",
                met: at_least(self.over("gateway.passthrough", "gateway.nginx"), 1.0),
            },
            Goal {
                name: "gateway.guarded / gateway.passthrough",
                json: Some("gateway_guarded_over_passthrough"),
                value: self.over("gateway.guarded", "gateway.passthrough"),
                target: "(reference)",
                met: None,
            },
            Goal {
                name: "gateway.guarded / gateway.nginx_post",
                json: Some("gateway_guarded_over_nginx_post"),
                value: self.over("gateway.guarded", "gateway.nginx_post"),
                target: ">= 0.8",
                met: at_least(self.over("gateway.guarded", "gateway.nginx_post"), 0.8),
            },
            Goal {
                name: "gateway.idempotency / gateway.nginx_post",
                json: Some("gateway_idempotency_over_nginx_post"),
                value: self.over("gateway.idempotency", "gateway.nginx_post"),
                target: ">= 0.5",
                met: at_least(self.over("gateway.idempotency", "gateway.nginx_post"), 0.5),
            },
            Goal {
                name: "gateway.guarded's ceiling, by Redis's CPU",
                json: Some("gateway_guarded_ceiling"),
                value: self.ceiling("gateway.guarded"),
                target: "(reference)",
                met: None,
            },
            Goal {
                name: "gateway.idempotency's ceiling, by Redis's CPU",
                json: Some("gateway_idempotency_ceiling"),
                value: self.ceiling("gateway.idempotency"),
                target: "(reference)",
                met: None,
            },
            Goal {
                name: "gateway.inproc.passthrough / .inproc.nginx",
                json: Some("gateway_inproc_passthrough_over_nginx"),
                value: self.over("gateway.inproc.passthrough", "gateway.inproc.nginx"),
                target: "(reference)",
                met: None,
            },
        ]
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
            // The gateway's ratios are measured on any store.
            let ratios: serde_json::Map<String, Value> = self
                .goals()
                .into_iter()
                .filter_map(|g| Some((g.json?.to_owned(), json!(g.value?))))
                .filter(|(k, _)| k.starts_with("gateway_"))
                .collect();
            out["ratios"] = Value::Object(ratios);
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
        let _ = writeln!(
            out,
            "norepeat bench: store {}{url}, {} concurrent tasks, {:.1} s per row\n",
            self.store,
            self.concurrency,
            self.duration.as_secs_f64()
        );
        let _ = writeln!(
            out,
            "{:<28} {:>12} {:>10} {:>10} {:>10} {:>12} {:>14}",
            "name", "ops/s", "p50 µs", "p99 µs", "cpu µs/op", "redis µs/op", "machine µs/op"
        );
        let or_dash = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |c| format!("{c:.2}"));
        for r in &self.results {
            let _ = writeln!(
                out,
                "{:<28} {:>12.0} {:>10.1} {:>10.1} {:>10} {:>12} {:>14}",
                r.name,
                r.ops_per_s,
                r.p50_us,
                r.p99_us,
                or_dash(r.cpu_us_per_op),
                or_dash(r.store_cpu_us_per_op),
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
            "{:<44} {:>10}  {:<12} result",
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
            let met = match g.met {
                Some(true) => "met",
                Some(false) => "MISSED",
                None if g.value.is_some() => "",
                None => "not measured",
            };
            let _ = writeln!(out, "{:<44} {:>10}  {:<12} {met}", g.name, value, g.target);
        }
        out
    }
}

#[cfg(test)]
mod tests {
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
        }
    }

    fn report(results: Vec<BenchResult>) -> Report {
        Report {
            store: "redis",
            url: None,
            concurrency: 64,
            duration: Duration::from_secs(1),
            results,
            memory: Err("not measured".to_owned()),
            ceiling: Err("not measured".to_owned()),
        }
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
        let c = r.ceiling("gateway.guarded").unwrap();
        assert!((c - 30.0 / 35.0).abs() < 1e-12, "{c}");
        // Without the store's figure (a Redis elsewhere), none.
        assert_eq!(r.ceiling("gateway.idempotency"), None);
        let json = r.to_json();
        assert!(json["ratios"]["gateway_guarded_ceiling"].as_f64().is_some());
        assert!(json["ratios"]["gateway_idempotency_ceiling"].is_null());
        // Without NGINX's, none either.
        let r = report(vec![row("gateway.guarded", Some(5.0), Some(40.0))]);
        assert_eq!(r.ceiling("gateway.guarded"), None);
    }
}
