//! The idempotency guard: take an `Idempotency-Key` (claim it, or learn in
//! the same round trip what holds it), and say why a request is refused
//! ([`IdempotencyError`]). It knows the store and its policies, not HTTP.

use super::record::{self, Completed, Digest, Owner};
use crate::claim::{self, Claim, Stamped};
use crate::degrade::{FailurePolicy, on_store_error};
use crate::store::{KeyValueStore, KeyValueStoreExt, StoreError};
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
    /// Whether the effect of the request that holds the key happened is
    /// unknown: it was abandoned (its lease passed with no renewal: its
    /// process died, or lost the store for a whole lease, see
    /// [`Abandoned`]), or its handler said so
    /// ([`OutcomeUnknown`](super::OutcomeUnknown)); it is not run again
    /// (409 `idempotency_outcome_unknown`).
    #[error("the request that held this Idempotency-Key was abandoned; its outcome is unknown")]
    OutcomeUnknown,
    /// The store failed and the layer fails closed (503
    /// `guard_unavailable`).
    #[error("the idempotency store is unavailable: {0}")]
    Unavailable(#[source] StoreError),
}

/// The longest pause between two looks at a running request's record while
/// waiting for its result.
const MAX_POLL: Duration = Duration::from_millis(100);

/// How far the clocks of two instances may disagree: a claim is taken over
/// only once its deadline is this far behind the taker's clock, so a live
/// owner on a clock that lags is not taken for a dead one.
pub(crate) const CLOCK_SKEW_MS: u64 = 1_000;

/// What a repeat does with a claim whose owner is gone: an in-progress
/// record whose lease passed with no renewal and no answer stored (the
/// process was killed, ran out of memory, lost its node, or lost the store
/// for a whole lease). Whether its effect happened is unknown.
///
/// ```
/// use norepeat::idempotency::{Abandoned, IdempotencyLayer};
/// use norepeat::store::MemoryStore;
/// // The effect commits with the record (`IdempotentTx`): an abandoned
/// // claim's transaction never committed, so a repeat may run again.
/// let layer = IdempotencyLayer::new(MemoryStore::default()).abandoned(Abandoned::Retry);
/// # let _ = layer;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Abandoned {
    /// The outcome is unknown, and so it stays: every repeat gets 409
    /// `idempotency_outcome_unknown` until the record's retention ends, and
    /// the handler never runs again (the default: an effect outside our
    /// store, a charge at a payment provider, may have happened).
    #[default]
    OutcomeUnknown,
    /// A repeat takes the claim over (one compare-and-set, so one repeat
    /// wins) and runs the handler again, as attempt number 2 (3, ...): the
    /// handler reads it from the request's [`Attempt`](super::Attempt)
    /// extension, to refuse or reconcile a second attempt. For effects that
    /// commit with the record ([`IdempotentTx`](super::IdempotentTx)), or
    /// backends idempotent themselves. A take-over waits until the deadline
    /// is a second behind the clock, for clocks that disagree.
    Retry,
}

/// How an `Idempotency-Key` was claimed (see "Vocabulary" in the crate
/// docs).
pub(super) enum Claimed<G: KeyValueStore + Clone> {
    /// This request holds the key and runs the handler, as attempt `u8`.
    Owned(Claim<G>, Owner, u8),
    /// The first request's stored response, to replay.
    Done(Completed),
    /// 409, 422 or 503.
    Refused(IdempotencyError),
    /// An unknown outcome (of attempt `attempt`, held in `existing`), with
    /// a [`Reconcile`](super::Reconcile) hook to ask: see `settle`.
    Unknown { existing: Bytes, attempt: u8 },
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
    /// How long a claimed record lives in the store: the retention, which
    /// an in-progress record lives too, so that an abandoned claim is not
    /// forgotten when its lease ends.
    pub(super) retention: Duration,
    /// What a repeat does with an abandoned claim.
    pub(super) abandoned: Abandoned,
    /// An unknown outcome is handed back ([`Claimed::Unknown`]) to be
    /// reconciled, not refused.
    pub(super) reconciling: bool,
    /// `norepeat_decisions_total{mode="idempotency",outcome="admitted"}`,
    /// the decision of nearly every request: its handle taken from the
    /// recorder at the first admission and kept (registering it at every
    /// call cost more than counting).
    pub(super) admitted: Arc<std::sync::OnceLock<metrics::Counter>>,
    /// `norepeat_decisions_total{mode="idempotency",outcome="replayed"}`,
    /// kept as `admitted` is: a replay's registration cost 2 % of its
    /// instructions through the gateway (1.2k of 51k, callgrind).
    pub(super) replayed: Arc<std::sync::OnceLock<metrics::Counter>>,
}

impl<G: KeyValueStore + Clone> IdempotencyGuard<G> {
    /// Takes the key, or learns in the same round trip what holds it. While
    /// waiting for a running request's result, the same call is repeated
    /// with backoff: it replays once the record completes, and takes the key
    /// itself if the first request released it.
    pub(super) async fn claim(&self, key: &str, fingerprint: &Digest) -> Claimed<G> {
        let mut owner: Owner = [0; 16];
        rand::fill(&mut owner[..]);
        let key: Arc<str> = Arc::from(key);
        let deadline = (!self.wait.is_zero()).then(|| Instant::now() + self.wait);
        let mut pause = Duration::from_millis(5);
        let stamped = Stamped {
            restamp: record::restamp,
            lease: self.lease,
        };
        // The in-progress record lives for the retention (at least the
        // lease); its lease deadline is inside it.
        let ttl = self.retention.max(self.lease);
        loop {
            let value = Bytes::from(record::in_progress(
                &owner,
                fingerprint,
                1,
                self.lease_end(),
            ));
            let taken =
                Claim::acquire_stamped(&self.store, Arc::clone(&key), value.clone(), ttl, stamped)
                    .await;
            let existing = match taken {
                Ok(claim::Claimed::Owned(c)) => {
                    self.admitted
                        .get_or_init(|| metrics::counter!("norepeat_decisions_total", "mode" => "idempotency", "outcome" => "admitted"))
                        .increment(1);
                    return Claimed::Owned(c, owner, 1);
                }
                Ok(claim::Claimed::Held(existing)) => existing,
                Err(e) => return self.on_claim_failure(e, key, value, None),
            };
            let rec = match record::decode(&existing) {
                Ok(r) => r,
                Err(e) => return self.on_failure(StoreError::Protocol(e.to_string())),
            };
            // Released by a request that ended with nothing kept (a 5xx):
            // taken over by this one, whatever its body, as the next attempt
            // (the backend may have seen the last one).
            let released = rec.released.then_some(rec.lease).flatten();
            if let Some(lease) = released {
                match self
                    .next_attempt(&key, &existing, owner, fingerprint, lease, ttl, stamped)
                    .await
                {
                    Some(out) => return out,
                    // Someone changed it first: look again.
                    None => continue,
                }
            }
            if !rec.is_for(fingerprint) {
                metrics::counter!("norepeat_decisions_total", "mode" => "idempotency", "outcome" => "rejected", "reason" => "mismatch").increment(1);
                return Claimed::Refused(IdempotencyError::Mismatch);
            }
            if let Some(done) = rec.completed {
                return Claimed::Done(done);
            }
            if rec.unknown.is_some() {
                if self.reconciling {
                    let attempt = rec.lease.map_or(1, |l| l.attempt);
                    return Claimed::Unknown { existing, attempt };
                }
                metrics::counter!("norepeat_decisions_total", "mode" => "idempotency", "outcome" => "rejected", "reason" => "outcome_unknown").increment(1);
                return Claimed::Refused(IdempotencyError::OutcomeUnknown);
            }
            if let Some(lease) = rec.lease {
                let now = crate::clock::now_ms();
                if claim::passed(lease.deadline, now, 0) {
                    match self.abandoned {
                        Abandoned::OutcomeUnknown if self.reconciling => {
                            return Claimed::Unknown {
                                existing,
                                attempt: lease.attempt,
                            };
                        }
                        Abandoned::OutcomeUnknown => {
                            metrics::counter!("norepeat_decisions_total", "mode" => "idempotency", "outcome" => "rejected", "reason" => "outcome_unknown").increment(1);
                            return Claimed::Refused(IdempotencyError::OutcomeUnknown);
                        }
                        Abandoned::Retry if claim::passed(lease.deadline, now, CLOCK_SKEW_MS) => {
                            match self
                                .next_attempt(
                                    &key,
                                    &existing,
                                    owner,
                                    fingerprint,
                                    lease,
                                    ttl,
                                    stamped,
                                )
                                .await
                            {
                                Some(out) => return out,
                                // Someone changed it first: look again.
                                None => continue,
                            }
                        }
                        // Within the clocks' skew: still in use.
                        Abandoned::Retry => {}
                    }
                }
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

    /// Takes the key over from the claim `existing` holds (released, or
    /// abandoned under [`Abandoned::Retry`]) as its next attempt (one
    /// compare-and-set): the claim, or a store failure's answer; `None`
    /// when someone changed the key first (the caller looks again).
    #[allow(clippy::too_many_arguments)]
    async fn next_attempt(
        &self,
        key: &Arc<str>,
        existing: &Bytes,
        owner: Owner,
        fingerprint: &Digest,
        lease: record::Lease,
        ttl: Duration,
        stamped: Stamped,
    ) -> Option<Claimed<G>> {
        let attempt = lease.attempt.saturating_add(1);
        let value = Bytes::from(record::in_progress(
            &owner,
            fingerprint,
            attempt,
            self.lease_end(),
        ));
        let taking = Claim::take_over(
            &self.store,
            Arc::clone(key),
            existing,
            value.clone(),
            ttl,
            stamped,
        );
        match taking.await {
            Ok(Some(c)) => {
                metrics::counter!("norepeat_decisions_total", "mode" => "idempotency", "outcome" => "admitted", "reason" => "take_over").increment(1);
                tracing::info!(
                    attempt,
                    "took over an idempotency claim as its next attempt"
                );
                Some(Claimed::Owned(c, owner, attempt))
            }
            Ok(None) => None,
            Err(e) => Some(self.on_claim_failure(
                e,
                Arc::clone(key),
                value,
                Some((existing.clone(), ttl)),
            )),
        }
    }

    /// Settles the unknown outcome `existing` holds (of attempt
    /// `attempt`) as a reconciliation found it: `done` (a completed
    /// record) stored in its place and replayed, or, with `None` (the
    /// effect did not happen), the key taken over by this request as the
    /// next attempt. A key someone changed first is in use (409): its
    /// repeat looks again.
    pub(super) async fn settle(
        &self,
        key: &str,
        existing: &Bytes,
        fingerprint: &Digest,
        attempt: u8,
        done: Option<(Vec<u8>, Completed)>,
    ) -> Claimed<G> {
        let ttl = self.retention.max(self.lease);
        if let Some((bytes, completed)) = done {
            return match self
                .store
                .replace_if_equals(key, existing, &bytes, ttl)
                .await
            {
                Ok(true) => Claimed::Done(completed),
                Ok(false) => Claimed::Refused(IdempotencyError::InUse),
                Err(e) => self.on_failure(e),
            };
        }
        let mut owner: Owner = [0; 16];
        rand::fill(&mut owner[..]);
        let stamped = Stamped {
            restamp: record::restamp,
            lease: self.lease,
        };
        let lease = record::Lease {
            attempt,
            deadline: 0,
        };
        let key: Arc<str> = Arc::from(key);
        self.next_attempt(&key, existing, owner, fingerprint, lease, ttl, stamped)
            .await
            .unwrap_or(Claimed::Refused(IdempotencyError::InUse))
    }

    /// The wall-clock end of a lease that starts now, in milliseconds.
    fn lease_end(&self) -> u64 {
        crate::clock::now_ms()
            .saturating_add(u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX))
    }

    /// The answer to a claim (`value` on `key`, over `previous` for a
    /// take-over) that failed with `e` (see [`claim::on_claim_error`]).
    fn on_claim_failure(
        &self,
        e: StoreError,
        key: Arc<str>,
        value: Bytes,
        previous: Option<(Bytes, Duration)>,
    ) -> Claimed<G> {
        let failure = self.failure;
        match claim::on_claim_error("idempotency", failure, e, &self.store, key, value, previous) {
            Ok(()) => Claimed::Unguarded,
            Err(e) => Claimed::Refused(IdempotencyError::Unavailable(e)),
        }
    }

    fn on_failure(&self, e: StoreError) -> Claimed<G> {
        match on_store_error("idempotency", self.failure, e) {
            Ok(()) => Claimed::Unguarded,
            Err(e) => Claimed::Refused(IdempotencyError::Unavailable(e)),
        }
    }
}
