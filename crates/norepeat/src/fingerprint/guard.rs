//! The fingerprint guard: decides a fingerprint against a store, holds it
//! with a [`Claim`], and says why it refused ([`FingerprintGuardError`]).

use crate::claim::{self, Renewal, Renewer};
use crate::clock::now_ms;
use crate::degrade::FailurePolicy;
use crate::fingerprinter::{Digest, Fingerprinter};
use crate::keys::{KeyBuilder, Namespace};
use crate::store::{Store, StoreError};
use bytes::Bytes;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Why [`FingerprintGuard::acquire`] refused a fingerprint. The layer
/// answers it as a [`Problem`](crate::problem::Problem) (`From` is in
/// its `layer.rs`, at the HTTP edge).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FingerprintGuardError {
    /// The fingerprint was seen within its window (409
    /// `duplicate_submission`).
    #[error(
        "duplicate submission: the same request was sent within its window; retry after {retry_after:?}"
    )]
    Duplicate {
        /// Time left in the window.
        retry_after: Duration,
    },
    /// The store failed and the guard fails closed (503
    /// `guard_unavailable`).
    #[error("the duplicate guard's store is unavailable: {0}")]
    Unavailable(#[source] StoreError),
}

/// What happens to a fingerprint's key once the handler is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ReleasePolicy {
    /// Hold the key for the rest of the window after a success (status below
    /// 400), so a double click a second after the order completed is still a
    /// duplicate; release it at once, owner-checked, after a failure (4xx,
    /// 5xx, error or panic), so the user can retry. A request dropped
    /// mid-handler counts as done: its key is held for the rest of the
    /// window, whatever the policy.
    #[default]
    HoldOnSuccess,
    /// Release when the handler finishes, whatever the outcome: the
    /// article's behaviour, which only stops *concurrent* repeats.
    ReleaseOnCompletion,
    /// Hold for the whole window whatever the outcome.
    HoldAlways,
}

/// Decides fingerprints against a store.
///
/// ```
/// use norepeat::fingerprint::{Digest, FingerprintGuard, FingerprintGuardError};
/// use norepeat::store::MemoryStore;
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let guard = FingerprintGuard::new(MemoryStore::default());
/// let fp = Digest([1; 32]);
/// let claim = guard.acquire(&fp).await.expect("first one passes");
/// let dup = guard.acquire(&fp).await.unwrap_err();
/// assert!(matches!(dup, FingerprintGuardError::Duplicate { .. }));
/// claim.finish(true).await; // success: held for the rest of the window
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct FingerprintGuard<S> {
    pub(crate) store: S,
    pub(crate) keys: KeyBuilder,
    pub(crate) fingerprinter: Fingerprinter,
    pub(crate) window: Duration,
    pub(crate) release: ReleasePolicy,
    pub(crate) failure: FailurePolicy,
    pub(crate) renew_max: Duration,
    /// Renews the keys of handlers that run long, from one task (`None`:
    /// each claim renews by itself, for a guard built per call).
    pub(crate) renewer: Option<Renewer<S>>,
    /// `norepeat_decisions_total{mode="fingerprint",outcome="admitted"}`:
    /// its handle taken from the recorder at the first admission and kept.
    admitted: Arc<OnceLock<metrics::Counter>>,
}

impl<S: Store + Clone> FingerprintGuard<S> {
    /// A guard with a 3 s window, [`ReleasePolicy::HoldOnSuccess`],
    /// fail-open, renewal while the handler runs up to a total hold of 30 s
    /// ([`renew_up_to`](Self::renew_up_to)), the default ignored fields.
    #[must_use]
    pub fn new(store: S) -> Self {
        let renewer = Renewer::new(store.clone());
        Self::with_renewer(store, Some(renewer))
    }

    /// A guard for one call (the attribute's window mode): its claim renews
    /// by itself, so no renewal task is started for it.
    pub(crate) fn for_one_call(store: S) -> Self {
        Self::with_renewer(store, None)
    }

    fn with_renewer(store: S, renewer: Option<Renewer<S>>) -> Self {
        Self {
            store,
            keys: KeyBuilder::default(),
            fingerprinter: Fingerprinter::default(),
            window: Duration::from_secs(3),
            release: ReleasePolicy::default(),
            failure: FailurePolicy::FailOpen,
            renew_max: Duration::from_secs(30),
            renewer,
            admitted: Arc::default(),
        }
    }

    /// The window, counted from the first request.
    #[must_use]
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window.max(Duration::from_millis(1));
        self
    }

    /// What to do with the key when the handler is done.
    #[must_use]
    pub fn release(mut self, policy: ReleasePolicy) -> Self {
        self.release = policy;
        self
    }

    /// What to do when the store fails.
    #[must_use]
    pub fn on_store_failure(mut self, policy: FailurePolicy) -> Self {
        self.failure = policy;
        self
    }

    /// While a handler runs past a third of the window, its key is extended
    /// (owner-checked) up to this total hold (default 30 s). Zero disables
    /// renewal.
    #[must_use]
    pub fn renew_up_to(mut self, max: Duration) -> Self {
        self.renew_max = max;
        self
    }

    /// The JSON fields left out of the fingerprint.
    #[must_use]
    pub fn fingerprinter(mut self, fingerprinter: Fingerprinter) -> Self {
        self.fingerprinter = fingerprinter;
        self
    }

    /// The key prefix and layout.
    #[must_use]
    pub fn keys(mut self, keys: KeyBuilder) -> Self {
        self.keys = keys;
        self
    }

    /// The store key of a fingerprint.
    #[must_use]
    pub fn key_of(&self, fp: &Digest) -> String {
        self.keys.key_for_digest(Namespace::Fingerprint, &fp.0)
    }

    /// Takes the fingerprint's place for the window, or tells when to retry.
    ///
    /// # Errors
    /// [`FingerprintGuardError::Duplicate`] with the time left in the
    /// window, or [`FingerprintGuardError::Unavailable`] when the store fails
    /// and the policy fails closed.
    pub async fn acquire(&self, fp: &Digest) -> Result<Claim<S>, FingerprintGuardError> {
        let key: Arc<str> = Arc::from(self.key_of(fp));
        let owner = Owner::new(self.window);
        let taking =
            claim::Claim::acquire(&self.store, Arc::clone(&key), owner.0.clone(), self.window);
        match taking.await {
            Ok(claim::Claimed::Owned(claim)) => {
                self.admitted
                    .get_or_init(|| metrics::counter!("norepeat_decisions_total", "mode" => "fingerprint", "outcome" => "admitted"))
                    .increment(1);
                Ok(Claim::held(self, claim))
            }
            Ok(claim::Claimed::Held(existing)) => {
                metrics::counter!("norepeat_decisions_total", "mode" => "fingerprint", "outcome" => "rejected", "reason" => "duplicate").increment(1);
                let retry_after = Owner::time_left(&existing).unwrap_or(self.window);
                Err(FingerprintGuardError::Duplicate { retry_after })
            }
            // Refused, the request runs nothing: a claim that landed all
            // the same must not hold its retries off for the window.
            Err(e) => claim::on_claim_error(
                "fingerprint",
                self.failure,
                e,
                &self.store,
                key,
                owner.0,
                None,
            )
            .map(|()| Claim::unheld(self))
            .map_err(FingerprintGuardError::Unavailable),
        }
    }
}

/// The value a guard writes: unique per acquisition, and carrying the end
/// of its window so a rejection can say when to retry without a second
/// round trip. Decimal `deadline_ms * 10^6 + random`, which Redis stores as a
/// plain integer (no string allocation).
#[derive(Debug, Clone)]
struct Owner(Bytes);

impl Owner {
    fn new(ttl: Duration) -> Self {
        let deadline = now_ms().saturating_add(u64::try_from(ttl.as_millis()).unwrap_or(0));
        let random: u64 = rand::random_range(0..1_000_000);
        let value = deadline % 9_000_000_000_000 * 1_000_000 + random;
        Self(Bytes::copy_from_slice(
            itoa::Buffer::new().format(value).as_bytes(),
        ))
    }

    fn time_left(value: &[u8]) -> Option<Duration> {
        let v: u64 = std::str::from_utf8(value).ok()?.parse().ok()?;
        let deadline = v / 1_000_000;
        Some(Duration::from_millis(deadline.saturating_sub(now_ms())))
    }
}

/// A fingerprint's place, held by one request.
///
/// Call [`finish`](Self::finish) when the handler is done. Dropped without
/// it (the request future was dropped, a client that disconnected), the
/// request counts as done: the key is held for the rest of its window,
/// whatever the policy, because the handler may already have had its effect.
/// Only a panic releases at once (as a failure does).
#[derive(Debug)]
pub struct Claim<S: Store + Clone> {
    claim: Option<claim::Claim<S>>,
    window: Duration,
    renew_max: Duration,
    policy: ReleasePolicy,
    renewer: Option<Renewer<S>>,
}

impl<S: Store + Clone> Claim<S> {
    fn held(g: &FingerprintGuard<S>, claim: claim::Claim<S>) -> Self {
        Self {
            claim: Some(claim),
            window: g.window,
            renew_max: g.renew_max,
            policy: g.release,
            renewer: g.renewer.clone(),
        }
    }

    fn unheld(g: &FingerprintGuard<S>) -> Self {
        Self {
            claim: None,
            window: g.window,
            renew_max: g.renew_max,
            policy: g.release,
            renewer: None,
        }
    }

    /// The store key this claim holds (empty when admitted without a store).
    #[must_use]
    pub fn key(&self) -> &str {
        self.claim.as_ref().map_or("", claim::Claim::key)
    }

    /// Whether the claim holds a key (false when admitted fail-open).
    #[must_use]
    pub fn is_held(&self) -> bool {
        self.claim.is_some()
    }

    /// Whether the key was taken from the local memory of a store that
    /// failed (a [`Fallback`](crate::store::Fallback)), not from the store.
    #[must_use]
    pub fn is_decided_locally(&self) -> bool {
        self.claim
            .as_ref()
            .is_some_and(claim::Claim::decided_locally)
    }

    /// Extends the key to a full window from now, if this claim still owns
    /// it. Returns whether it did.
    ///
    /// # Errors
    /// When the store fails.
    pub async fn renew(&self) -> Result<bool, StoreError> {
        match &self.claim {
            Some(c) => c.renew().await,
            None => Ok(false),
        }
    }

    /// Runs `work` (the handler), renewing the key every third of the window
    /// while it runs, up to the guard's [`renew_up_to`](FingerprintGuard::renew_up_to).
    /// The guard's renewal task does the renewing; this future only
    /// registers the key with it and removes it when it ends or is
    /// dropped, so renewal stops with it.
    pub async fn run<F: std::future::Future>(&self, work: F) -> F::Output {
        let renewal = Renewal::up_to(self.window, self.renew_max);
        match (&self.claim, &self.renewer) {
            (Some(c), Some(renewer)) => c.run_renewed_by(renewer, work, renewal).await,
            (Some(c), None) => c.run(work, renewal).await,
            (None, _) => work.await,
        }
    }

    /// The handler is done: hold or release the key per the policy.
    pub async fn finish(mut self, success: bool) {
        let release = match self.policy {
            ReleasePolicy::HoldOnSuccess => !success,
            ReleasePolicy::ReleaseOnCompletion => true,
            ReleasePolicy::HoldAlways => false,
        };
        match self.claim.take() {
            Some(c) if release => c.release().await,
            Some(c) => c.keep(),
            None => {}
        }
    }
}
