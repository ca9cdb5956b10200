//! Once mode: the body runs at most once per key with success, and later
//! calls get its stored result.

use super::{Guarded, Rejected};
use crate::claim::{self, Claim, Completion, Renewal};
use crate::degrade::on_store_error;
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
const CLAIM: u8 = b'P';
const DONE: u8 = b'D';

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
        let claim = match self.claim(store, key).await {
            Ok(Claimed::Owned(claim)) => claim,
            Ok(Claimed::Done(v)) => return Ok(v),
            Ok(Claimed::Unguarded) => return body.await,
            Err(r) => return Err(E::from(r)),
        };
        // Not detachable (the body may borrow `&self` and the arguments):
        // renewal lives in this future, and a dropped call keeps its claim
        // until the lease ends.
        let (retention, lease) = self.times();
        let out = claim.run(body, Renewal::thirds(lease)).await;
        finish(claim, encode(out.as_ref().ok()), retention, lease).await;
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
        let claim = match self.claim(store, key).await {
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
    pub(super) async fn claim<S, T>(&self, store: &S, key: &str) -> Result<Claimed<S, T>, Rejected>
    where
        S: KeyValueStore + Clone,
        T: DeserializeOwned,
    {
        let (_, lease) = self.times();
        let key: Arc<str> = Arc::from(self.store_key(key));
        let mut claim_value = Vec::with_capacity(17);
        claim_value.push(CLAIM);
        claim_value.extend_from_slice(format!("{:016x}", rand::random::<u64>()).as_bytes());
        let claim_value = Bytes::from(claim_value);
        let deadline = tokio::time::Instant::now() + self.wait;
        let mut pause = Duration::from_millis(5);
        loop {
            let existing = match Claim::acquire(store, Arc::clone(&key), claim_value.clone(), lease)
                .await
            {
                Ok(claim::Claimed::Owned(claim)) => {
                    metrics::counter!("norepeat_decisions_total", "mode" => "once", "outcome" => "admitted").increment(1);
                    return Ok(Claimed::Owned(claim));
                }
                Ok(claim::Claimed::Held(existing)) => existing,
                Err(e) => {
                    return on_store_error("once", self.failure, e)
                        .map(|()| Claimed::Unguarded)
                        .map_err(Rejected::from);
                }
            };
            if let Some(done) = stored(&existing) {
                return done.map(Claimed::Done);
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
