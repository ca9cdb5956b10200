//! What a storm run found: one row per scenario × defence, the table for
//! people (the JSON is the rows serialised).

use super::harness::{RowCtx, Sample};
use super::shops::Counts;
use serde::Serialize;

/// One line of the result.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Scenario name.
    pub scenario: &'static str,
    /// `naive`, or the layers of defence.
    pub defence: String,
    /// Requests sent.
    pub sent: usize,
    /// Orders that should exist.
    pub expected: usize,
    /// Orders that exist.
    pub created: usize,
    /// Orders beyond one per logical order.
    pub duplicates: usize,
    /// Units ordered beyond the stock.
    pub oversold: i64,
    /// Requests answered 4xx (stopped at the door, or refused by the database).
    pub rejected: usize,
    /// Median latency.
    pub p50_ms: f64,
    /// 99th percentile latency.
    pub p99_ms: f64,
}

/// The `p` quantile of sorted latencies, to 0.01 ms.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    (sorted[idx.min(sorted.len() - 1)] * 100.0).round() / 100.0
}

/// The row of one scenario under one defence.
pub(super) fn row(
    scenario: &'static str,
    defence: &str,
    ctx: &RowCtx,
    samples: &[Sample],
    c: Counts,
) -> Row {
    let mut ms: Vec<f64> = samples.iter().map(|s| s.ms).collect();
    ms.sort_by(f64::total_cmp);
    Row {
        scenario,
        defence: defence.to_owned(),
        sent: samples.len(),
        expected: ctx.logical,
        created: c.created,
        duplicates: c.duplicates,
        oversold: c.oversold,
        rejected: samples
            .iter()
            .filter(|s| (400..500).contains(&s.status))
            .count(),
        p50_ms: percentile(&ms, 0.5),
        p99_ms: percentile(&ms, 0.99),
    }
}

/// The table for people.
#[must_use]
pub fn table(rows: &[Row]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<20} {:<9} {:>5} {:>8} {:>7} {:>10} {:>8} {:>8} {:>8} {:>8}",
        "scenario",
        "defence",
        "sent",
        "expected",
        "created",
        "duplicates",
        "oversold",
        "rejected",
        "p50 ms",
        "p99 ms"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<20} {:<9} {:>5} {:>8} {:>7} {:>10} {:>8} {:>8} {:>8.1} {:>8.1}",
            r.scenario,
            r.defence,
            r.sent,
            r.expected,
            r.created,
            r.duplicates,
            r.oversold,
            r.rejected,
            r.p50_ms,
            r.p99_ms
        );
    }
    out
}
