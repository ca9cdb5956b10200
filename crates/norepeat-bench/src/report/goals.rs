//! The goals a run is read by: each ratio of a row to its yardstick or
//! anchor, with its target (issues 15, 26, 28 and 53), from one round's
//! results or as the median of the rounds'.

use super::{BenchResult, Report, median, range};

/// A figure against its target (issues 15, 26, 28 and 53).
pub(super) struct Goal {
    pub(super) name: &'static str,
    /// The key under `ratios` in the JSON, for ratios.
    pub(super) json: Option<&'static str>,
    pub(super) value: Option<f64>,
    target: Target,
    /// With `--rounds N`, the lowest and highest of the rounds' values
    /// (`value` is then their median).
    pub(super) range: Option<[f64; 2]>,
}

/// What a figure should reach.
#[derive(Clone, Copy)]
pub(super) enum Target {
    AtLeast(f64),
    AtMost(f64),
    /// No goal: shown beside the others to read them by.
    Reference,
}

impl Goal {
    fn new(
        name: &'static str,
        json: Option<&'static str>,
        value: Option<f64>,
        target: Target,
    ) -> Self {
        Self {
            name,
            json,
            value,
            target,
            range: None,
        }
    }

    pub(super) fn met(&self) -> Option<bool> {
        match self.target {
            Target::AtLeast(t) => self.value.map(|v| v >= t),
            Target::AtMost(t) => self.value.map(|v| v <= t),
            Target::Reference => None,
        }
    }

    pub(super) fn target_text(&self) -> String {
        match self.target {
            Target::AtLeast(t) => format!(">= {t}"),
            Target::AtMost(t) => format!("<= {t}"),
            Target::Reference => "(reference)".to_owned(),
        }
    }
}

/// Row `name` among `results`.
fn find<'r>(results: &'r [BenchResult], name: &str) -> Option<&'r BenchResult> {
    results.iter().find(|r| r.name == name)
}

/// `a`'s rate over `b`'s.
fn over(results: &[BenchResult], a: &str, b: &str) -> Option<f64> {
    let (a, b) = (find(results, a)?, find(results, b)?);
    Some(a.ops_per_s / b.ops_per_s)
}

/// `a`'s proxy CPU time per request over `b`'s.
fn cpu_over(results: &[BenchResult], a: &str, b: &str) -> Option<f64> {
    let (a, b) = (find(results, a)?, find(results, b)?);
    Some(a.cpu_us_per_op? / b.cpu_us_per_op?)
}

/// The most `row` could reach against `gateway.nginx_post` if its proxy
/// cost no more CPU than NGINX's: NGINX's request costs the machine `m` µs
/// of busy time (generator, backend, proxy), `row`'s adds at least the `s`
/// µs its Redis server spends, so on cores all of them share the ratio is
/// at most `m / (m + s)`.
pub(super) fn ceiling(results: &[BenchResult], row: &str) -> Option<f64> {
    let m = find(results, "gateway.nginx_post")?.machine_cpu_us_per_op?;
    let s = find(results, row)?.store_cpu_us_per_op?;
    Some(m / (m + s))
}

/// A gateway row against its anchor: the rate ratio (with its goal) and
/// the ratio of the proxies' CPU time per request (a reference).
fn pair(
    rs: &[BenchResult],
    out: &mut Vec<Goal>,
    [name, json, cpu_name, cpu_json]: [&'static str; 4],
    [a, b]: [&str; 2],
    target: Target,
) {
    out.push(Goal::new(name, Some(json), over(rs, a, b), target));
    out.push(Goal::new(
        cpu_name,
        Some(cpu_json),
        cpu_over(rs, a, b),
        Target::Reference,
    ));
}

impl Report {
    /// The goals, from one round's results or, with `--rounds N`, each
    /// ratio the median of the rounds' (each round's rows ran next to each
    /// other, so a ratio is taken within a round, never across).
    pub(super) fn goals(&self) -> Vec<Goal> {
        let mut goals = self.goals_of(&self.results);
        if self.rounds.len() <= 1 {
            return goals;
        }
        let per_round: Vec<Vec<Goal>> = self.rounds.iter().map(|r| self.goals_of(r)).collect();
        for (i, g) in goals.iter_mut().enumerate() {
            if g.json.is_none() {
                continue;
            }
            let values: Vec<f64> = per_round.iter().filter_map(|r| r.get(i)?.value).collect();
            g.value = median(values.iter().copied());
            g.range = (values.len() > 1).then(|| range(&values));
        }
        goals
    }

    fn goals_of(&self, rs: &[BenchResult]) -> Vec<Goal> {
        use Target::{AtLeast, AtMost, Reference};
        let ops = |name: &str| find(rs, name).map(|r| r.ops_per_s);
        let ceiling_ops = self.ceiling.as_ref().ok().map(|c| c.ops_per_s);
        let one_key = self.ceiling.as_ref().ok().map(|c| c.one_key_ops_per_s);
        let by = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
        let mem = self.memory.as_ref().ok();
        let mut g = vec![
            Goal::new(
                "fingerprint.acquire / redis.raw",
                Some("fingerprint_acquire_over_raw"),
                over(rs, "fingerprint.acquire", "redis.raw"),
                AtLeast(0.95),
            ),
            Goal::new(
                "token.consume / redis.raw",
                Some("token_consume_over_raw"),
                over(rs, "token.consume", "redis.raw"),
                AtLeast(0.95),
            ),
            Goal::new(
                "http.guarded / http.unguarded",
                Some("http_guarded_over_unguarded"),
                over(rs, "http.guarded", "http.unguarded"),
                Reference,
            ),
            Goal::new(
                "http.guarded / http.handrolled",
                Some("http_guarded_over_handrolled"),
                over(rs, "http.guarded", "http.handrolled"),
                AtLeast(0.95),
            ),
            Goal::new(
                "idempotency.cycle / idempotency.store_cycle",
                Some("idempotency_cycle_over_store_cycle"),
                over(rs, "idempotency.cycle", "idempotency.store_cycle"),
                AtLeast(0.75),
            ),
            Goal::new(
                "idempotency.replay / redis.raw",
                Some("idempotency_replay_over_raw"),
                over(rs, "idempotency.replay", "redis.raw"),
                AtLeast(0.9),
            ),
            Goal::new(
                "fingerprint.acquire.replicas1 / .replicas0",
                Some("replicas1_over_replicas0"),
                over(
                    rs,
                    "fingerprint.acquire.replicas1",
                    "fingerprint.acquire.replicas0",
                ),
                Reference,
            ),
            Goal::new(
                "fingerprint.acquire / redis-benchmark ceiling",
                Some("fingerprint_acquire_over_ceiling"),
                by(ops("fingerprint.acquire"), ceiling_ops),
                AtLeast(0.4),
            ),
            Goal::new(
                "redis.raw / redis-benchmark ceiling",
                Some("raw_over_ceiling"),
                by(ops("redis.raw"), ceiling_ops),
                Reference,
            ),
            Goal::new(
                "fingerprint.duplicate / one-key ceiling",
                Some("fingerprint_duplicate_over_one_key_ceiling"),
                by(ops("fingerprint.duplicate"), one_key),
                Reference,
            ),
            Goal::new(
                "bytes per fingerprint key",
                None,
                mem.map(|m| m.bytes_per_fingerprint_key),
                AtMost(120.0),
            ),
            Goal::new(
                "bytes per idempotency record in progress",
                None,
                mem.map(|m| m.bytes_per_idempotency_in_progress),
                AtMost(150.0),
            ),
            Goal::new(
                "bytes per completed record (64 B body)",
                None,
                mem.map(|m| m.bytes_per_idempotency_completed),
                AtMost(250.0),
            ),
            Goal::new(
                "idempotency.claim ops/s",
                None,
                ops("idempotency.claim"),
                AtLeast(150_000.0),
            ),
            Goal::new(
                "idempotency.cycle ops/s",
                None,
                ops("idempotency.cycle"),
                AtLeast(60_000.0),
            ),
            Goal::new(
                "gateway.passthrough / gateway.direct",
                Some("gateway_passthrough_over_direct"),
                over(rs, "gateway.passthrough", "gateway.direct"),
                Reference,
            ),
        ];
        // The anchors of issue 53, each with the proxies' CPU beside it.
        pair(
            rs,
            &mut g,
            [
                "gateway.passthrough / gateway.nginx",
                "gateway_passthrough_over_nginx",
                "  its CPU per request / nginx's",
                "gateway_passthrough_cpu_over_nginx",
            ],
            ["gateway.passthrough", "gateway.nginx"],
            AtLeast(1.0),
        );
        pair(
            rs,
            &mut g,
            [
                "gateway.guarded / gateway.nginx_lua",
                "gateway_guarded_over_nginx_lua",
                "  its CPU per request / nginx_lua's",
                "gateway_guarded_cpu_over_nginx_lua",
            ],
            ["gateway.guarded", "gateway.nginx_lua"],
            AtLeast(1.5),
        );
        pair(
            rs,
            &mut g,
            [
                "gateway.idempotency / .idempotent_proxy",
                "gateway_idempotency_over_idempotent_proxy",
                "  its CPU per request / idempotent-proxy's",
                "gateway_idempotency_cpu_over_idempotent_proxy",
            ],
            ["gateway.idempotency", "gateway.idempotent_proxy"],
            AtLeast(3.0),
        );
        pair(
            rs,
            &mut g,
            [
                "gateway.replay / .idempotent_proxy_replay",
                "gateway_replay_over_idempotent_proxy_replay",
                "  its CPU per request / idempotent-proxy's",
                "gateway_replay_cpu_over_idempotent_proxy_replay",
            ],
            ["gateway.replay", "gateway.idempotent_proxy_replay"],
            AtLeast(6.0),
        );
        pair(
            rs,
            &mut g,
            [
                "gateway.idempotency / gateway.nginx_post",
                "gateway_idempotency_over_nginx_post",
                "  its CPU per request / nginx's",
                "gateway_idempotency_cpu_over_nginx_post",
            ],
            ["gateway.idempotency", "gateway.nginx_post"],
            AtLeast(0.5),
        );
        pair(
            rs,
            &mut g,
            [
                "gateway.guarded / gateway.nginx_post",
                "gateway_guarded_over_nginx_post",
                "  its CPU per request / nginx's",
                "gateway_guarded_cpu_over_nginx_post",
            ],
            ["gateway.guarded", "gateway.nginx_post"],
            AtLeast(0.8),
        );
        g.extend([
            Goal::new(
                "gateway.guarded / gateway.passthrough",
                Some("gateway_guarded_over_passthrough"),
                over(rs, "gateway.guarded", "gateway.passthrough"),
                Reference,
            ),
            Goal::new(
                "gateway.guarded's ceiling, by Redis's CPU",
                Some("gateway_guarded_ceiling"),
                ceiling(rs, "gateway.guarded"),
                Reference,
            ),
            Goal::new(
                "gateway.idempotency's ceiling, by Redis's CPU",
                Some("gateway_idempotency_ceiling"),
                ceiling(rs, "gateway.idempotency"),
                Reference,
            ),
        ]);
        // The gateway against an earlier build of itself (`--gateway-before`).
        for (now, before, json) in [
            (
                "gateway.passthrough",
                "gateway.before.passthrough",
                "gateway_passthrough_over_before",
            ),
            (
                "gateway.guarded",
                "gateway.before.guarded",
                "gateway_guarded_over_before",
            ),
            (
                "gateway.idempotency",
                "gateway.before.idempotency",
                "gateway_idempotency_over_before",
            ),
        ] {
            g.push(Goal::new(
                json,
                Some(json),
                over(rs, now, before),
                Reference,
            ));
        }
        g.push(Goal::new(
            "gateway.inproc.passthrough / .inproc.nginx",
            Some("gateway_inproc_passthrough_over_nginx"),
            over(rs, "gateway.inproc.passthrough", "gateway.inproc.nginx"),
            Reference,
        ));
        g
    }
}
