//! Reconciliation: a repeat that meets an unknown outcome asks the
//! application what became of it, instead of being refused until the
//! record ends.
//!
//! An outcome is unknown when a request timed out downstream
//! ([`OutcomeUnknown`](super::OutcomeUnknown)) or its claim was abandoned
//! (its process died, under [`Abandoned::OutcomeUnknown`](super::Abandoned)).
//! With a [`Reconcile`] hook, the first repeat to meet it asks, and the
//! answer settles the key for every later one:
//!
//! | the hook says | the repeat gets | the record |
//! |---|---|---|
//! | [`Reconciled::Done`] | that answer, with `Idempotent-Replayed: true` and `Idempotency-Reconciled: true` | that answer, replayed to every later repeat |
//! | [`Reconciled::Absent`] | the handler's answer, run as the next [`Attempt`](super::Attempt) | taken over by this attempt (one compare-and-set) |
//! | [`Reconciled::Unknown`] | 409 `idempotency_outcome_unknown` | unchanged |

use bytes::Bytes;
use http::HeaderName;
use http::request::Parts;
use std::future::Future;
use std::pin::Pin;

/// The header a reconciled answer carries, stored with it and replayed:
/// the answer is the application's account of an outcome that was
/// unknown, not the first request's own response.
pub const IDEMPOTENCY_RECONCILED: HeaderName = HeaderName::from_static("idempotency-reconciled");

/// What became of a request whose outcome was unknown, as the application
/// found it ([`Reconcile`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum Reconciled {
    /// The effect happened, and this is its answer: stored as the key's
    /// record and replayed.
    Done(http::Response<Bytes>),
    /// The effect did not happen: the key is taken over and the repeat
    /// runs, as the next attempt.
    Absent,
    /// Nobody can tell yet: the repeat is refused (409), the record stays.
    Unknown,
}

/// The boxed future a [`Reconcile`] hook returns.
pub type ReconcileFuture = Pin<Box<dyn Future<Output = Reconciled> + Send + 'static>>;

/// Asks what became of the request with the client's key `key` whose
/// outcome is unknown; `req` is the repeat's head (its caller's headers).
/// Implemented for closures.
///
/// ```
/// use norepeat::idempotency::{IdempotencyLayer, Reconciled};
/// use norepeat::store::MemoryStore;
/// // A payment service that can look its payments up by key.
/// let layer = IdempotencyLayer::new(MemoryStore::default()).reconcile(
///     |_req: &http::request::Parts, key: &str| {
///         let found = key.starts_with("paid-");
///         async move {
///             if found {
///                 Reconciled::Done(http::Response::new(bytes::Bytes::from_static(b"{\"paid\":true}")))
///             } else {
///                 Reconciled::Absent
///             }
///         }
///     },
/// );
/// # let _ = layer;
/// ```
pub trait Reconcile: Send + Sync + 'static {
    /// The lookup.
    fn reconcile(&self, req: &Parts, key: &str) -> ReconcileFuture;
}

impl<F, Fut> Reconcile for F
where
    F: Fn(&Parts, &str) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Reconciled> + Send + 'static,
{
    fn reconcile(&self, req: &Parts, key: &str) -> ReconcileFuture {
        Box::pin(self(req, key))
    }
}
