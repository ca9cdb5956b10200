//! The gateway's metrics per route, labelled by the route's `match`: each
//! series is registered on its first use and its handle kept, so counting
//! a request allocates nothing (no label string per request).
//!
//! | metric | labels |
//! |---|---|
//! | `norepeat_gateway_requests_total` | `route`, `outcome` ([`Outcome`]) |
//! | `norepeat_gateway_shadow_total` | `route`, `would` ([`WOULD`]) |
//! | `norepeat_gateway_invalid_total` | `route`, `code` ([`INVALID`]) |
//! | `norepeat_gateway_upstream_seconds` | `route` (a histogram) |
//!
//! The gateway-wide series (reloads, connections timed out, accept errors,
//! TLS reloads) are counted where they happen (`listen/mod.rs`, `listen/connection.rs`,
//! `tls.rs`).

use http::Response;
use metrics::{Counter, Histogram};
use norepeat::shadow::ShadowedBy;
use std::sync::{Arc, OnceLock};

/// What one request on a route came to: the `outcome` of
/// `norepeat_gateway_requests_total`, exactly the contract's list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Passed,
    Replayed,
    Duplicate,
    InProgress,
    Mismatch,
    RateLimited,
    Unauthenticated,
    FailOpen,
    Unavailable,
    UpstreamUnavailable,
    UpstreamTimeout,
    Unknown,
}

impl Outcome {
    const ALL: [Outcome; 12] = [
        Outcome::Passed,
        Outcome::Replayed,
        Outcome::Duplicate,
        Outcome::InProgress,
        Outcome::Mismatch,
        Outcome::RateLimited,
        Outcome::Unauthenticated,
        Outcome::FailOpen,
        Outcome::Unavailable,
        Outcome::UpstreamUnavailable,
        Outcome::UpstreamTimeout,
        Outcome::Unknown,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Passed => "passed",
            Outcome::Replayed => "replayed",
            Outcome::Duplicate => "duplicate",
            Outcome::InProgress => "in_progress",
            Outcome::Mismatch => "mismatch",
            Outcome::RateLimited => "rate_limited",
            Outcome::Unauthenticated => "unauthenticated",
            Outcome::FailOpen => "fail_open",
            Outcome::Unavailable => "unavailable",
            Outcome::UpstreamUnavailable => "upstream_unavailable",
            Outcome::UpstreamTimeout => "upstream_timeout",
            Outcome::Unknown => "outcome_unknown",
        }
    }
}

/// The `would` of `norepeat_gateway_shadow_total`: the decisions a shadow
/// route would have refused or replayed.
pub(crate) const WOULD: [&str; 5] = [
    "duplicate",
    "replay",
    "in_progress",
    "mismatch",
    "rate_limited",
];

/// The `code` of `norepeat_gateway_invalid_total`: the refusals of a
/// request malformed for its guard (4xx before any decision), which
/// `norepeat_gateway_requests_total` does not count (see the README).
pub(crate) const INVALID: [&str; 5] = [
    "missing_token",
    "missing_idempotency_key",
    "invalid_idempotency_key",
    "invalid_request",
    "payload_too_large",
];

/// How a layer's refusal (its problem's `code`) is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counted {
    /// In `norepeat_gateway_requests_total`.
    Request(Outcome),
    /// In `norepeat_gateway_invalid_total`, by [`INVALID`]'s index.
    Invalid(usize),
}

/// The count of a refusal answered with `code`. A token that is used,
/// expired, forged or another user's is `duplicate` (the library answers
/// them 409 `duplicate_submission`, an expired one 409 `token_expired`); a code of none of the lists (a
/// layer's future one) is `unavailable`, never a label outside the list.
pub(crate) fn of_code(code: &str) -> Counted {
    let outcome = match code {
        "duplicate_submission" | "token_expired" => Outcome::Duplicate,
        "idempotency_key_in_use" => Outcome::InProgress,
        "idempotency_key_mismatch" => Outcome::Mismatch,
        "rate_limited" => Outcome::RateLimited,
        "unauthenticated" => Outcome::Unauthenticated,
        "upstream_unavailable" => Outcome::UpstreamUnavailable,
        "upstream_timeout" => Outcome::UpstreamTimeout,
        "idempotency_outcome_unknown" => Outcome::Unknown,
        other => match INVALID.iter().position(|c| *c == other) {
            Some(i) => return Counted::Invalid(i),
            None => Outcome::Unavailable,
        },
    };
    Counted::Request(outcome)
}

/// One route's series, registered on first use.
pub(crate) struct RouteMetrics {
    label: Arc<str>,
    requests: [OnceLock<Counter>; 12],
    shadow: [OnceLock<Counter>; 5],
    invalid: [OnceLock<Counter>; 5],
    /// `norepeat_gateway_responses_total{route,class}`: 1xx to 5xx.
    classes: [OnceLock<Counter>; 5],
    upstream: OnceLock<Histogram>,
}

impl RouteMetrics {
    pub(crate) fn new(label: Arc<str>) -> Self {
        Self {
            label,
            requests: Default::default(),
            shadow: Default::default(),
            invalid: Default::default(),
            classes: Default::default(),
            upstream: OnceLock::new(),
        }
    }

    /// Counts an answer of `status` to a request on the route, by its
    /// class (`2xx` ... `5xx`): what a dashboard of errors per route reads.
    pub(crate) fn answered(&self, status: u16) {
        const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];
        let Some(i) = usize::from(status / 100).checked_sub(1).filter(|i| *i < 5) else {
            return;
        };
        self.classes[i]
            .get_or_init(|| {
                metrics::counter!(
                    "norepeat_gateway_responses_total",
                    "route" => self.label.to_string(),
                    "class" => CLASSES[i],
                )
            })
            .increment(1);
    }

    /// The route's `match`, its `route` label.
    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    pub(crate) fn count(&self, counted: Counted) {
        match counted {
            Counted::Request(o) => {
                let i = Outcome::ALL.iter().position(|x| *x == o).unwrap_or(0);
                self.requests[i]
                    .get_or_init(|| {
                        metrics::counter!(
                            "norepeat_gateway_requests_total",
                            "route" => self.label.to_string(),
                            "outcome" => o.as_str(),
                        )
                    })
                    .increment(1);
            }
            Counted::Invalid(i) => {
                let Some((slot, code)) = self.invalid.get(i).zip(INVALID.get(i)) else {
                    return;
                };
                slot.get_or_init(|| {
                    metrics::counter!(
                        "norepeat_gateway_invalid_total",
                        "route" => self.label.to_string(),
                        "code" => *code,
                    )
                })
                .increment(1);
            }
        }
    }

    /// Counts a shadowed decision `would`: in `norepeat_gateway_shadow_total`
    /// when it is one of [`WOULD`], in `norepeat_gateway_invalid_total` when
    /// it is one of [`INVALID`]; any other (no caller, the store down) only
    /// in the library's `norepeat_shadow_total{guard,would}`.
    pub(crate) fn shadowed(&self, would: &'static str) {
        if let Some(i) = WOULD.iter().position(|w| *w == would) {
            self.shadow[i]
                .get_or_init(|| {
                    metrics::counter!(
                        "norepeat_gateway_shadow_total",
                        "route" => self.label.to_string(),
                        "would" => would,
                    )
                })
                .increment(1);
        } else if let Some(i) = INVALID.iter().position(|c| *c == would) {
            self.count(Counted::Invalid(i));
        }
    }

    /// Records one upstream call's time.
    pub(crate) fn upstream(&self, seconds: f64) {
        self.upstream
            .get_or_init(|| {
                metrics::histogram!("norepeat_gateway_upstream_seconds", "route" => self.label.to_string())
            })
            .record(seconds);
    }
}

/// `norepeat_gateway_shadow_total{route,would}`, from the library's typed
/// shadow record.
///
/// A layer in shadow mode counts `norepeat_shadow_total{guard,would}`
/// (no route) and adds what it would have refused to the response's
/// [`ShadowedBy`]. The gateway reads that list where the route's response
/// comes back, and counts each entry by the route's `match`, so its metric
/// is labelled by template as the contract asks, whatever the log filter.
/// Only the contract's `would` values go there (`duplicate`, `replay`,
/// `in_progress`, `mismatch`, `rate_limited`); a malformed request a
/// shadowed guard would have refused is counted in
/// `norepeat_gateway_invalid_total{route,code}`, and a store that failed
/// under a fail-closed shadowed guard makes the request's outcome
/// `fail_open` (it went through undecided).
///
/// Counts each shadowed decision on `res` by `metrics`' route: one per
/// layer that would have refused it (a rate limit and a guard both: two).
/// Answers whether one of them would have refused because the store
/// failed.
pub(crate) fn count_shadowed<B>(metrics: &RouteMetrics, res: &Response<B>) -> bool {
    let Some(ShadowedBy(list)) = res.extensions().get::<ShadowedBy>() else {
        return false;
    };
    let mut store_failed = false;
    for s in list {
        store_failed |= s.would == "unavailable";
        metrics.shadowed(s.would);
    }
    store_failed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code a layer or the gateway answers lands in one of the
    /// contract's outcomes or in the invalid list, never in a label of its
    /// own.
    #[test]
    fn every_code_is_counted_by_the_contracts_labels() {
        let outcome = |c| match of_code(c) {
            Counted::Request(o) => o.as_str(),
            Counted::Invalid(i) => INVALID[i],
        };
        for (code, want) in [
            ("duplicate_submission", "duplicate"),
            ("token_expired", "duplicate"),
            ("idempotency_key_in_use", "in_progress"),
            ("idempotency_key_mismatch", "mismatch"),
            ("rate_limited", "rate_limited"),
            ("unauthenticated", "unauthenticated"),
            ("guard_unavailable", "unavailable"),
            ("upstream_unavailable", "upstream_unavailable"),
            ("upstream_timeout", "upstream_timeout"),
            ("idempotency_outcome_unknown", "outcome_unknown"),
            ("missing_token", "missing_token"),
            ("missing_idempotency_key", "missing_idempotency_key"),
            ("invalid_idempotency_key", "invalid_idempotency_key"),
            ("invalid_request", "invalid_request"),
            ("payload_too_large", "payload_too_large"),
            ("something_new", "unavailable"),
        ] {
            assert_eq!(outcome(code), want, "{code}");
        }
        let labels: Vec<&str> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(
            labels,
            [
                "passed",
                "replayed",
                "duplicate",
                "in_progress",
                "mismatch",
                "rate_limited",
                "unauthenticated",
                "fail_open",
                "unavailable",
                "upstream_unavailable",
                "upstream_timeout",
                "outcome_unknown"
            ]
        );
    }
}
