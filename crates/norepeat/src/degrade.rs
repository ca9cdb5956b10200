//! What a store failure means for a request: fail open or fail closed,
//! per route.
//!
//! Redis goes away: restarts, stalls, full memory, failovers. A guard must
//! then neither hang nor take its routes down with it. Two halves:
//!
//! - the store side keeps a failing store from hanging a request: time
//!   budgets and a circuit breaker ([`Resilient`](crate::store::Resilient)),
//!   and a bounded local memory that keeps deciding
//!   ([`Fallback`](crate::store::Fallback));
//! - this module decides what a failure that still reaches a guard means
//!   for the request: [`FailurePolicy::FailOpen`] admits it (deciding
//!   against the fallback when the store has one),
//!   [`FailurePolicy::FailClosed`] refuses it (an HTTP layer answers 503
//!   `guard_unavailable` with `Retry-After`). Every guard, limiter and
//!   idempotency layer asks the same function.
//!
//! # What an outage means for guarantees
//! While the primary store is unavailable, a fail-open route only catches
//! repeats that reach *the same instance*; a repeat sent to another instance
//! gets through the door. What an instance decided during the outage holds
//! there for the decision's whole TTL, also once the primary is back. The
//! database's unique business keys and conditional updates are the backstop
//! that keeps the *effect* single.
//!
//! ```
//! use norepeat::degrade::FailurePolicy;
//! use norepeat::fingerprint::FingerprintGuard;
//! use norepeat::store::{Fallback, MemoryStore, Resilient};
//! use std::time::Duration;
//!
//! let primary = MemoryStore::new(1_000); // a RedisStore in production
//! let store = Fallback::new(
//!     Resilient::new(primary).timeout(Duration::from_millis(50)),
//!     MemoryStore::new(10_000),
//! );
//! let guard = FingerprintGuard::new(store).on_store_failure(FailurePolicy::FailOpen);
//! ```

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

/// The guards that let a request through because their store failed and
/// their policy is [`FailurePolicy::FailOpen`]: put in the response's
/// extensions by the fingerprint, token, Idempotency-Key and rate-limit
/// layers, so code outside the layer (a gateway counting `fail_open`, a
/// test) can tell a request admitted unguarded from one admitted by a
/// decision. A response no layer admitted that way has none. The names are
/// the layers' `guard` labels (`fingerprint`, `token`, `idempotency`,
/// `rate_limit`), innermost first; an outer layer adds to the list.
///
/// Plain data, free of HTTP: read it with
/// `response.extensions().get::<FailedOpen>()`.
///
/// ```
/// use axum::{Router, body::Body, routing::post};
/// use norepeat::degrade::FailedOpen;
/// use norepeat::fingerprint::{FingerprintGuard, FingerprintLayer};
/// use norepeat::store::{MemoryStore, Resilient};
/// use std::time::Duration;
/// use tower::ServiceExt;
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// // A breaker opened by one failure: every store call fails at once.
/// let store = Resilient::new(MemoryStore::default()).breaker(1, Duration::from_secs(60));
/// store.circuit().record(false);
/// let app = Router::new()
///     .route("/orders", post(|| async { "ok" }))
///     .layer(FingerprintLayer::new(FingerprintGuard::new(store)));
/// let req = http::Request::post("/orders")
///     .header("x-user-id", "u1")
///     .body(Body::from("{}"))
///     .unwrap();
/// let res = app.oneshot(req).await.unwrap();
/// assert_eq!(res.status(), 200);
/// assert_eq!(res.extensions().get::<FailedOpen>(), Some(&FailedOpen(vec!["fingerprint"])));
/// # }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FailedOpen(pub Vec<&'static str>);

impl FailedOpen {
    /// Adds `guard` to the list in `extensions`, creating it if there is none.
    pub(crate) fn add(extensions: &mut http::Extensions, guard: &'static str) {
        add_name(extensions, guard, |f: &mut Self| &mut f.0, Self);
    }
}

/// Adds `guard` to the list of names `T` in `extensions` (read with
/// `names`), creating it with `new` if there is none: the one way the
/// layers' marks grow.
fn add_name<T: Clone + Send + Sync + 'static>(
    extensions: &mut http::Extensions,
    guard: &'static str,
    names: fn(&mut T) -> &mut Vec<&'static str>,
    new: fn(Vec<&'static str>) -> T,
) {
    match extensions.get_mut::<T>() {
        Some(marks) => names(marks).push(guard),
        None => {
            extensions.insert(new(vec![guard]));
        }
    }
}

/// The guards that let a request through on a decision of the local
/// memory, their store having failed: their store is a
/// [`Fallback`](crate::store::Fallback), whose memory catches the repeats
/// this instance sees while the store is down, not those another instance
/// sees. Put in the response's extensions by the fingerprint, token,
/// Idempotency-Key and rate-limit layers, beside [`FailedOpen`] (admitted
/// with no decision at all), so a gateway or a test can count such a
/// request apart from one the store admitted. The names are the layers'
/// `guard` labels, innermost first.
///
/// ```
/// use axum::{Router, body::Body, routing::post};
/// use norepeat::degrade::DecidedLocally;
/// use norepeat::fingerprint::{FingerprintGuard, FingerprintLayer};
/// use norepeat::store::{Fallback, MemoryStore, Resilient};
/// use std::time::Duration;
/// use tower::ServiceExt;
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// // A primary whose breaker is open, with a local memory behind it.
/// let primary = Resilient::new(MemoryStore::default()).breaker(1, Duration::from_secs(60));
/// primary.circuit().record(false);
/// let store = Fallback::new(primary, MemoryStore::default());
/// let app = Router::new()
///     .route("/orders", post(|| async { "ok" }))
///     .layer(FingerprintLayer::new(FingerprintGuard::new(store)));
/// let order = || {
///     http::Request::post("/orders")
///         .header("x-user-id", "u1")
///         .body(Body::from("{}"))
///         .unwrap()
/// };
/// let res = app.clone().oneshot(order()).await.unwrap();
/// assert_eq!(res.status(), 200);
/// assert_eq!(res.extensions().get::<DecidedLocally>(), Some(&DecidedLocally(vec!["fingerprint"])));
/// // The local memory caught the repeat.
/// assert_eq!(app.oneshot(order()).await.unwrap().status(), 409);
/// # }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DecidedLocally(pub Vec<&'static str>);

impl DecidedLocally {
    /// Adds `guard` to the list in `extensions`, creating it if there is none.
    pub(crate) fn add(extensions: &mut http::Extensions, guard: &'static str) {
        add_name(extensions, guard, |d: &mut Self| &mut d.0, Self);
    }
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
