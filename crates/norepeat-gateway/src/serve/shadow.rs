//! `norepeat_gateway_shadow_total{route,would}`, from the library's typed
//! shadow record.
//!
//! A layer in shadow mode counts `norepeat_shadow_total{guard,would}`
//! (no route) and adds what it would have refused to the response's
//! [`ShadowedBy`]. The gateway reads that list where the route's response
//! comes back, and counts each entry by the route's `match`, so its metric
//! is labelled by template as the contract asks, whatever the log filter.
//! Only the contract's `would` values go there (`duplicate`, `replay`,
//! `in_progress`, `mismatch`, `rate_limited`); a malformed request a
//! shadowed guard would have refused is counted in
//! `norepeat_gateway_invalid_total{route,code}`, and a store that failed
//! under a fail-closed shadowed guard makes the request's outcome
//! `fail_open` (it went through undecided).

use super::count::RouteMetrics;
use http::Response;
use norepeat::shadow::ShadowedBy;

/// Counts each shadowed decision on `res` by `metrics`' route: one per
/// layer that would have refused it (a rate limit and a guard both: two).
/// Answers whether one of them would have refused because the store
/// failed.
pub(super) fn count<B>(metrics: &RouteMetrics, res: &Response<B>) -> bool {
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
