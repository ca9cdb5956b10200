//! Once mode: the body runs at most once per key with success, and later
//! calls get its stored result.

use super::{Guarded, Rejected};
use crate::claim::{self, Claim, Completion, Renewal, Stamped};
use crate::idempotency::Abandoned;
use crate::store::{KeyValueStore, Store};
use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// The longest pause between two looks at a running call's claim while
/// waiting for its result.
const MAX_POLL: Duration = Duration::from_millis(100);

/// Tag bytes of a once-mode value: a claim in progress, or a stored result.
/// A claim is `L`, 8 random bytes of its owner, its attempt number (one
/// byte) and its lease deadline (wall-clock milliseconds, 8 bytes big
/// endian), rewritten by each renewal; the record lives for the retention,
/// so a claim whose process died is seen as abandoned, not forgotten.
const CLAIM: u8 = b'L';
// A claim as the release before this one wrote it (`P` and 16 hex
// digits, no deadline) is neither a result nor a claim with a lease: it is
// honoured as running while it lives (its lease).
const DONE: u8 = b'D';
/// The length of a claim value.
const CLAIM_LEN: usize = 1 + 8 + 1 + 8;

impl Guarded {
    /// Once mode: runs `body` at most once per key with success; later calls
    /// get the stored `Ok` value.
    ///
    /// # Errors
    /// The body's error (after which the key is free again), or
    /// `E::from(`[`Rejected`]`)`: `InProgress` while another call with the
    /// key runs, `Unavailable` when the store fails and the policy fails
    /// closed, `Unreadable` when the stored result does not deserialize.
    pub async fn run_once<S, T, E, F>(&self, store: &S, key: &str, body: F) -> Result<T, E>
    where
        S: Store + Clone,
        T: Serialize + DeserializeOwned,
        E: From<Rejected>,
        F: Future<Output = Result<T, E>>,
    {
        let abandoned = self.abandoned.unwrap_or_default();
        let claim = match self.claim(store, key, abandoned).await {
            Ok(Claimed::Owned(claim)) => claim,
            Ok(Claimed::Done(v)) => return Ok(v),
            Ok(Claimed::Unguarded) => return body.await,
            Err(r) => return Err(E::from(r)),
        };
        // Not detachable (the body may borrow `&self` and the arguments):
        // renewal lives in this future, and a call dropped while the body
        // runs leaves its claim to be found abandoned. Once the body is
        // done, storing its result is carried to its end even if this
        // call is dropped meanwhile (a store that hangs).
        let (retention, lease) = self.times();
        let out = claim.run(body, Renewal::thirds(lease)).await;
        let done = encode(out.as_ref().ok());
        claim::carry_on(Box::pin(finish(claim, done, retention, lease))).await;
        out
    }

    /// Once mode, for a body that owns what it uses (`'static + Send`): like
    /// [`run_once`](Self::run_once), but the body runs in a task of its own.
    /// Once it has started it runs to its end and its result is stored even
    /// if this call's future is dropped; a later call gets that result (or
    /// [`Rejected::InProgress`] while it still runs). Needs a Tokio runtime
    /// (without one the body runs inline).
    ///
    /// # Errors
    /// As [`run_once`](Self::run_once).
    ///
    /// ```
    /// use norepeat::attribute::{Guarded, Rejected};
    /// use norepeat::store::MemoryStore;
    /// # #[derive(Debug, PartialEq)] struct E;
    /// # impl From<Rejected> for E { fn from(_: Rejected) -> Self { E } }
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let store = MemoryStore::default();
    /// let once = Guarded::once("points::award");
    /// let first: Result<u32, E> = once.run_once_detached(&store, "order-1", async { Ok(30) }).await;
    /// let again: Result<u32, E> = once.run_once_detached(&store, "order-1", async { Ok(99) }).await;
    /// assert_eq!((first, again), (Ok(30), Ok(30)));
    /// # }
    /// ```
    pub async fn run_once_detached<S, T, E, F>(&self, store: &S, key: &str, body: F) -> Result<T, E>
    where
        S: Store + Clone,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: From<Rejected> + Send + 'static,
        F: Future<Output = Result<T, E>> + Send + 'static,
    {
        let abandoned = self.abandoned.unwrap_or_default();
        let claim = match self.claim(store, key, abandoned).await {
            Ok(Claimed::Owned(claim)) => claim,
            Ok(Claimed::Done(v)) => return Ok(v),
            Ok(Claimed::Unguarded) => return body.await,
            Err(r) => return Err(E::from(r)),
        };
        let (retention, lease) = self.times();
        crate::claim::detach(async move {
            let out = claim.run(body, Renewal::thirds(lease)).await;
            finish(claim, encode(out.as_ref().ok()), retention, lease).await;
            out
        })
        .await
    }

    /// Once mode's claim: the key, or the stored result, or a refusal. A
    /// key in progress is looked at again, with backoff, for up to the
    /// wait: the call replays once the result is stored, and takes the key
    /// itself if the running call released it.
    pub(super) async fn claim<S, T>(
        &self,
        store: &S,
        key: &str,
        abandoned: Abandoned,
    ) -> Result<Claimed<S, T>, Rejected>
    where
        S: KeyValueStore + Clone,
        T: DeserializeOwned,
    {
        let (retention, lease) = self.times();
        let key: Arc<str> = Arc::from(self.store_key(key));
        let owner: [u8; 8] = rand::random();
        let stamped = Stamped { restamp, lease };
        // The claim lives as long as a result would (at least the lease):
        // the deadline inside it says whether its owner still runs.
        let ttl = retention.max(lease);
        let deadline = tokio::time::Instant::now() + self.wait;
        let mut pause = Duration::from_millis(5);
        loop {
            let value = claim_value(&owner, 1, lease);
            let existing = match Claim::acquire_stamped(
                store,
                Arc::clone(&key),
                value.clone(),
                ttl,
                stamped,
            )
            .await
            {
                Ok(claim::Claimed::Owned(claim)) => {
                    metrics::counter!("norepeat_decisions_total", "mode" => "once", "outcome" => "admitted").increment(1);
                    return Ok(Claimed::Owned(claim));
                }
                Ok(claim::Claimed::Held(existing)) => existing,
                Err(e) => return self.on_claim_error(e, store, key, value, None),
            };
            if let Some(done) = stored(&existing) {
                return done.map(Claimed::Done);
            }
            if let Some((attempt, ends)) = lease_of(&existing) {
                let now = crate::clock::now_ms();
                if now > ends {
                    match abandoned {
                        Abandoned::OutcomeUnknown => {
                            metrics::counter!("norepeat_decisions_total", "mode" => "once", "outcome" => "rejected", "reason" => "outcome_unknown").increment(1);
                            return Err(Rejected::OutcomeUnknown);
                        }
                        Abandoned::Retry
                            if now > ends.saturating_add(crate::idempotency::CLOCK_SKEW_MS) =>
                        {
                            let value = claim_value(&owner, attempt.saturating_add(1), lease);
                            let k = Arc::clone(&key);
                            let taking =
                                Claim::take_over(store, k, &existing, value.clone(), ttl, stamped);
                            match taking.await {
                                Ok(Some(claim)) => {
                                    metrics::counter!("norepeat_decisions_total", "mode" => "once", "outcome" => "admitted", "reason" => "take_over").increment(1);
                                    return Ok(Claimed::Owned(claim));
                                }
                                Ok(None) => continue,
                                Err(e) => {
                                    let previous = Some((existing, ttl));
                                    return self.on_claim_error(e, store, key, value, previous);
                                }
                            }
                        }
                        Abandoned::Retry => {}
                    }
                }
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                metrics::counter!("norepeat_decisions_total", "mode" => "once", "outcome" => "rejected", "reason" => "in_progress").increment(1);
                return Err(Rejected::InProgress);
            }
            tokio::time::sleep(pause.min(deadline - now)).await;
            pause = (pause * 2).min(MAX_POLL);
        }
    }

    /// The answer to a claim (`value` on `key`) that failed with `e`: the
    /// policy decides; a refused call whose claim may have landed takes it
    /// back, or puts `previous` back where it took that over.
    fn on_claim_error<S: KeyValueStore + Clone, T>(
        &self,
        e: crate::store::StoreError,
        store: &S,
        key: Arc<str>,
        value: Bytes,
        previous: Option<(Bytes, Duration)>,
    ) -> Result<Claimed<S, T>, Rejected> {
        claim::on_claim_error("once", self.failure, e, store, key, value, previous)
            .map(|()| Claimed::Unguarded)
            .map_err(Rejected::from)
    }
}

/// A claim value: `owner`'s claim number `attempt`, whose lease ends
/// `lease` from now.
fn claim_value(owner: &[u8; 8], attempt: u8, lease: Duration) -> Bytes {
    let ends =
        crate::clock::now_ms().saturating_add(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX));
    let mut v = Vec::with_capacity(CLAIM_LEN);
    v.push(CLAIM);
    v.extend_from_slice(owner);
    v.push(attempt.max(1));
    v.extend_from_slice(&ends.to_be_bytes());
    Bytes::from(v)
}

/// A claim value with its lease deadline moved to `ends` (a renewal).
fn restamp(claimed: &[u8], ends: u64) -> Option<Vec<u8>> {
    if claimed.len() != CLAIM_LEN || claimed[0] != CLAIM {
        return None;
    }
    let mut v = claimed.to_vec();
    v[CLAIM_LEN - 8..].copy_from_slice(&ends.to_be_bytes());
    Some(v)
}

/// The attempt number and lease deadline of a claim value; `None` for a
/// stored result or a claim of the release before this one.
fn lease_of(value: &[u8]) -> Option<(u8, u64)> {
    if value.len() != CLAIM_LEN || value[0] != CLAIM {
        return None;
    }
    let mut ends = [0; 8];
    ends.copy_from_slice(&value[CLAIM_LEN - 8..]);
    Some((value[9], u64::from_be_bytes(ends)))
}

/// What an existing once-mode value means for a repeat: its stored result
/// (or `Unreadable`), or `None` while a call holds it in progress.
fn stored<T: DeserializeOwned>(existing: &[u8]) -> Option<Result<T, Rejected>> {
    match existing.split_first() {
        Some((&DONE, json)) => Some(match serde_json::from_slice::<T>(json) {
            Ok(v) => {
                metrics::counter!("norepeat_decisions_total", "mode" => "once", "outcome" => "replayed").increment(1);
                Ok(v)
            }
            Err(e) => Err(Rejected::Unreadable(e.to_string())),
        }),
        _ => None,
    }
}

/// What a once-mode claim attempt found.
pub(super) enum Claimed<S: KeyValueStore + Clone, T> {
    /// This call holds the key and runs the body.
    Owned(Claim<S>),
    /// The stored result of an earlier call.
    Done(T),
    /// The store failed and the policy fails open: run without a claim.
    Unguarded,
}

/// The stored form of a result: `D` and its JSON.
pub(super) fn encode<T: Serialize>(ok: Option<&T>) -> Option<Result<Vec<u8>, serde_json::Error>> {
    ok.map(|v| {
        let mut out = vec![DONE];
        serde_json::to_writer(&mut out, v).map(|()| out)
    })
}

/// Stores the result (success) or releases the claim (failure).
///
/// The key of a body that succeeded is never deleted: its effect happened.
/// When the store does not take the result, it is tried again with backoff
/// for up to the lease (in a task of its own where there is a runtime, so
/// the call returns at once), and a repeat meanwhile waits or gets
/// [`Rejected::InProgress`]. If the store stays away that long, the claim
/// ends with its lease and a repeat runs again; that loss, and a result
/// whose claim was gone (expired, or forgotten by the store), are counted
/// in `norepeat_once_completion_lost_total`.
async fn finish<S: Store + Clone>(
    claim: Claim<S>,
    done: Option<Result<Vec<u8>, serde_json::Error>>,
    retention: Duration,
    lease: Duration,
) {
    match done {
        Some(Ok(done)) => {
            claim
                .complete_or_keep_trying(done, retention, lease, None, count)
                .await;
        }
        Some(Err(e)) => {
            tracing::warn!(key = claim.key(), error = %e, "once: the result does not serialize; releasing the key");
            claim.release().await;
        }
        None => claim.release().await,
    }
}

/// Counts a result that could not be stored: the store stayed away for
/// the whole lease, or the claim was gone when the result came (it
/// expired, or the store forgot it).
fn count(outcome: Completion) {
    if outcome != Completion::Stored {
        metrics::counter!("norepeat_once_completion_lost_total").increment(1);
    }
}
