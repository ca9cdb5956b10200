//! Surviving store faults: time budgets, a circuit breaker, failure
//! policies per route, a bounded local fallback, lease renewal.
//!
//! Redis goes away: restarts, stalls, full memory, failovers. A guard must
//! then neither hang nor take its routes down with it. The pieces, composed
//! as stores in front of stores (the shape of a cache in front of a store):
//!
//! - [`Resilient`] gives every call a time budget and puts a [`Breaker`] in
//!   front: after repeated failures it opens and the store is not asked at
//!   all (no timeout paid) until a single probe after a cool-down succeeds.
//!   A probe that is cancelled or runs out of time counts as failed, so the
//!   breaker never stays half-open. The budget adapts to the store's
//!   observed latency (3 times its recent p99, between 50 ms and 1 s): slow
//!   is not down, and a route fails open only when the breaker is open or a
//!   call has used up the adapted budget. Retries after timeouts are exactly
//!   when duplicates arrive; a fixed 50 ms budget would let two instances
//!   both fail open on the same request.
//! - [`Fallback`] answers from a bounded, expiring [`MemoryStore`] whenever
//!   the primary fails, so each instance still catches its own repeats during
//!   an outage.
//! - [`FailurePolicy`] per route: `FailOpen` admits (deciding against the
//!   fallback when there is one), `FailClosed` answers 503
//!   `guard_unavailable` with `Retry-After`.
//!
//! # What an outage means for guarantees
//! While the primary store is unavailable, a fail-open route only catches
//! repeats that reach *the same instance*; a repeat sent to another instance
//! gets through the door. What an instance decided during the outage holds
//! there for the decision's whole TTL, also once the primary is back. The database's unique business keys and
//! conditional updates are the backstop that keeps the *effect* single.
//!
//! ```
//! use norepeat::degrade::{Fallback, Resilient};
//! use norepeat::store::{MemoryStore, Store};
//! use std::time::Duration;
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let primary = MemoryStore::new(1_000); // a RedisStore in production
//! let store = Fallback::new(
//!     Resilient::new(primary).timeout(Duration::from_millis(50)),
//!     MemoryStore::new(10_000),
//! );
//! assert!(store.put_if_absent("k", b"1", Duration::from_secs(1)).await.unwrap().is_none());
//! # }
//! ```
//!
//! [`MemoryStore`]: crate::store::MemoryStore

mod breaker;
mod fallback;
mod resilient;

pub use breaker::{Breaker, BreakerState, Permit};
pub use fallback::Fallback;
pub use resilient::Resilient;

/// What a guarded route does when its store fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailurePolicy {
    /// Admit the request (deciding against the local fallback, if the store
    /// has one). The default for tokens and fingerprints: the database is
    /// the backstop.
    #[default]
    FailOpen,
    /// Refuse with 503 `guard_unavailable` and `Retry-After`: for routes
    /// (payments) that must not run when they cannot be sure.
    FailClosed,
}

/// What a store failure means for one request under `policy`: the one place
/// this is decided, for every guard, limiter and idempotency layer.
///
/// `Ok(())`: admit the request without a decision (fail-open), counted as
/// `admitted_degraded` and logged. `Err(error)`: refuse it (fail-closed),
/// counted as `rejected` with reason `unavailable`; the caller wraps the
/// error in its own domain error. `mode` labels the metric and the log
/// (`"fingerprint"`, `"token"`, `"once"`, `"idempotency"`, `"ratelimit"`).
pub(crate) fn on_store_error(
    mode: &'static str,
    policy: FailurePolicy,
    error: crate::store::StoreError,
) -> Result<(), crate::store::StoreError> {
    match policy {
        FailurePolicy::FailOpen => {
            metrics::counter!("norepeat_decisions_total", "mode" => mode, "outcome" => "admitted_degraded").increment(1);
            tracing::warn!(mode, %error, "store failed: admitting (fail-open)");
            Ok(())
        }
        FailurePolicy::FailClosed => {
            metrics::counter!("norepeat_decisions_total", "mode" => mode, "outcome" => "rejected", "reason" => "unavailable").increment(1);
            tracing::warn!(mode, %error, "store failed: refusing (fail-closed)");
            Err(error)
        }
    }
}
