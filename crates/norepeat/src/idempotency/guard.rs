//! The idempotency guard: take an `Idempotency-Key` (claim it, or learn in
//! the same round trip what holds it), and say why a request is refused
//! ([`IdempotencyError`]). It knows the store and its policies, not HTTP.

use super::record::{self, Completed, Digest, Owner};
use crate::claim::{self, Claim};
use crate::degrade::{FailurePolicy, on_store_error};
use crate::store::{KeyValueStore, StoreError};
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Why the Idempotency-Key layer refused a request with a key. The layer
/// answers it as a [`Problem`](crate::problem::Problem) (`From` is in
/// its `layer.rs`, at the HTTP edge).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdempotencyError {
    /// A request with this key is still running (409
    /// `idempotency_key_in_use`, `Retry-After: 1`).
    #[error("a request with this Idempotency-Key is still being processed")]
    InUse,
    /// The key was used with another request (422
    /// `idempotency_key_mismatch`).
    #[error("this Idempotency-Key was used with a different request")]
    Mismatch,
    /// The store failed and the layer fails closed (503
    /// `guard_unavailable`).
    #[error("the idempotency store is unavailable: {0}")]
    Unavailable(#[source] StoreError),
}

/// The longest pause between two looks at a running request's record while
/// waiting for its result.
const MAX_POLL: Duration = Duration::from_millis(100);

/// How an `Idempotency-Key` was claimed (see "Vocabulary" in the crate
/// docs).
pub(super) enum Claimed<G: KeyValueStore + Clone> {
    /// This request holds the key and runs the handler.
    Owned(Claim<G>, Owner),
    /// The first request's stored response, to replay.
    Done(Completed),
    /// 409, 422 or 503.
    Refused(IdempotencyError),
    /// The store failed and the route fails open.
    Unguarded,
}

/// The decision half of the idempotency layer: where records live, how
/// long a claim lasts, how long a repeat waits for the first one's result,
/// and what a store failure does.
#[derive(Clone)]
pub(super) struct IdempotencyGuard<G> {
    pub(super) store: G,
    /// The life of an unrenewed claim.
    pub(super) lease: Duration,
    /// How long a repeat waits for a running request's result
    /// (`Duration::ZERO`: not at all).
    pub(super) wait: Duration,
    pub(super) failure: FailurePolicy,
}

impl<G: KeyValueStore + Clone> IdempotencyGuard<G> {
    /// Takes the key, or learns in the same round trip what holds it. While
    /// waiting for a running request's result, the same call is repeated
    /// with backoff: it replays once the record completes, and takes the key
    /// itself if the first request released it.
    pub(super) async fn claim(&self, key: &str, fingerprint: &Digest) -> Claimed<G> {
        let mut owner: Owner = [0; 16];
        rand::fill(&mut owner[..]);
        let value = Bytes::from(record::in_progress(&owner, fingerprint));
        let key: Arc<str> = Arc::from(key);
        let deadline = (!self.wait.is_zero()).then(|| Instant::now() + self.wait);
        let mut pause = Duration::from_millis(5);
        loop {
            let taken =
                Claim::acquire(&self.store, Arc::clone(&key), value.clone(), self.lease).await;
            let existing = match taken {
                Ok(claim::Claimed::Owned(c)) => {
                    metrics::counter!("norepeat_decisions_total", "mode" => "idempotency", "outcome" => "admitted").increment(1);
                    return Claimed::Owned(c, owner);
                }
                Ok(claim::Claimed::Held(existing)) => existing,
                Err(e) => return self.on_failure(e),
            };
            let rec = match record::decode(&existing) {
                Ok(r) => r,
                Err(e) => return self.on_failure(StoreError::Protocol(e.to_string())),
            };
            if !rec.is_for(fingerprint) {
                metrics::counter!("norepeat_decisions_total", "mode" => "idempotency", "outcome" => "rejected", "reason" => "mismatch").increment(1);
                return Claimed::Refused(IdempotencyError::Mismatch);
            }
            if let Some(done) = rec.completed {
                return Claimed::Done(done);
            }
            let now = Instant::now();
            match deadline {
                Some(d) if now < d => {
                    tokio::time::sleep(pause.min(d - now)).await;
                    pause = (pause * 2).min(MAX_POLL);
                }
                _ => {
                    metrics::counter!("norepeat_decisions_total", "mode" => "idempotency", "outcome" => "rejected", "reason" => "in_use").increment(1);
                    return Claimed::Refused(IdempotencyError::InUse);
                }
            }
        }
    }

    fn on_failure(&self, e: StoreError) -> Claimed<G> {
        match on_store_error("idempotency", self.failure, e) {
            Ok(()) => Claimed::Unguarded,
            Err(e) => Claimed::Refused(IdempotencyError::Unavailable(e)),
        }
    }
}
