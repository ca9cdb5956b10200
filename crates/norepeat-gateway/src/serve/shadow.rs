//! `norepeat_gateway_shadow_total{route,would}`, from the library's typed
//! shadow record.
//!
//! A layer in shadow mode counts `norepeat_shadow_total{guard,would}`
//! (no route) and adds what it would have refused to the response's
//! [`ShadowedBy`]. The gateway reads that list where the route's response
//! comes back, and counts each entry by the route's `match`, so its metric
//! is labelled by template as the contract asks, whatever the log filter.

use http::Response;
use norepeat::shadow::ShadowedBy;

/// Counts each shadowed decision on `res` in
/// `norepeat_gateway_shadow_total{route = label, would}`: one per layer
/// that would have refused it (a rate limit and a guard both: two).
pub(super) fn count<B>(label: &str, res: &Response<B>) {
    let Some(ShadowedBy(list)) = res.extensions().get::<ShadowedBy>() else {
        return;
    };
    for s in list {
        metrics::counter!(
            "norepeat_gateway_shadow_total",
            "route" => label.to_owned(),
            "would" => s.would,
        )
        .increment(1);
    }
}
