//! The fingerprint guard and its lease.

use crate::degrade::FailurePolicy;
use crate::fingerprint::{Fingerprint, Fingerprinter};
use crate::keys::{KeyBuilder, Mode};
use crate::problem::{Code, Problem};
use crate::store::{Store, StoreError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What happens to a fingerprint's key once the handler is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ReleasePolicy {
    /// Hold the key for the rest of the window after a success (status below
    /// 400), so a double click a second after the order completed is still a
    /// duplicate; release it at once, owner-checked, after a failure (4xx,
    /// 5xx, error, or the request dropped), so the user can retry.
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
/// use norepeat::fingerprint::Fingerprint;
/// use norepeat::guard::FingerprintGuard;
/// use norepeat::store::MemoryStore;
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let guard = FingerprintGuard::new(MemoryStore::default());
/// let fp = Fingerprint([1; 32]);
/// let lease = guard.acquire(&fp).await.expect("first one passes");
/// let dup = guard.acquire(&fp).await.unwrap_err();
/// assert_eq!(dup.code.as_str(), "duplicate_submission");
/// lease.finish(true).await; // success: held for the rest of the window
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
    pub(crate) message: &'static str,
}

impl<S: Store + Clone> FingerprintGuard<S> {
    /// A guard with a 3 s window, [`ReleasePolicy::HoldOnSuccess`],
    /// fail-open, renewal up to 10 windows, the default ignored fields.
    #[must_use]
    pub fn new(store: S) -> Self {
        Self {
            store,
            keys: KeyBuilder::default(),
            fingerprinter: Fingerprinter::default(),
            window: Duration::from_secs(3),
            release: ReleasePolicy::default(),
            failure: FailurePolicy::FailOpen,
            renew_max: Duration::from_secs(30),
            message: "This request was already submitted; wait before sending it again.",
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
    /// (owner-checked) up to this total hold. Zero disables renewal.
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

    /// The `detail` of the 409 answer.
    #[must_use]
    pub fn message(mut self, message: &'static str) -> Self {
        self.message = message;
        self
    }

    /// The store key of a fingerprint.
    #[must_use]
    pub fn key_of(&self, fp: &Fingerprint) -> String {
        self.keys.key_for_digest(Mode::Fingerprint, &fp.0)
    }

    /// Takes the fingerprint's place for the window, or tells when to retry.
    ///
    /// # Errors
    /// A [`Problem`]: 409 `duplicate_submission` with `Retry-After`, or 503
    /// `guard_unavailable` when the store fails and the policy fails closed.
    pub async fn acquire(&self, fp: &Fingerprint) -> Result<Lease<S>, Problem> {
        let key = self.key_of(fp);
        let owner = Owner::new(self.window);
        match self
            .store
            .put_if_absent(&key, owner.as_bytes(), self.window)
            .await
        {
            Ok(None) => {
                metrics::counter!("norepeat_decisions_total", "mode" => "fingerprint", "outcome" => "admitted").increment(1);
                Ok(Lease::held(self, key, owner))
            }
            Ok(Some(existing)) => {
                metrics::counter!("norepeat_decisions_total", "mode" => "fingerprint", "outcome" => "rejected", "reason" => "duplicate").increment(1);
                let left = Owner::time_left(&existing).unwrap_or(self.window);
                Err(Problem::new(Code::DuplicateSubmission)
                    .detail(self.message)
                    .retry_after(left))
            }
            Err(e) => self.on_failure(e).map(|()| Lease::unheld(self)),
        }
    }

    fn on_failure(&self, e: StoreError) -> Result<(), Problem> {
        store_failure("fingerprint", self.failure, &e)
    }
}

/// Applies a failure policy to a store error; shared by every guard.
pub(crate) fn store_failure(
    mode: &'static str,
    policy: FailurePolicy,
    e: &StoreError,
) -> Result<(), Problem> {
    match policy {
        FailurePolicy::FailOpen => {
            metrics::counter!("norepeat_decisions_total", "mode" => mode, "outcome" => "admitted_degraded").increment(1);
            tracing::warn!(mode, error = %e, "guard store failed: admitting (fail-open)");
            Ok(())
        }
        FailurePolicy::FailClosed => {
            metrics::counter!("norepeat_decisions_total", "mode" => mode, "outcome" => "rejected", "reason" => "unavailable").increment(1);
            Err(Problem::new(Code::GuardUnavailable)
                .detail("The duplicate guard cannot decide right now; retry shortly.")
                .retry_after_secs(1))
        }
    }
}

/// The value a guard writes: unique per acquisition, and carrying the end
/// of its window so a rejection can say when to retry without a second
/// round trip. Decimal `deadline_ms * 10^6 + random`, which Redis stores as a
/// plain integer (no string allocation).
#[derive(Debug, Clone)]
pub(crate) struct Owner(String);

impl Owner {
    pub(crate) fn new(ttl: Duration) -> Self {
        let deadline = now_ms().saturating_add(u64::try_from(ttl.as_millis()).unwrap_or(0));
        let random: u64 = rand::random_range(0..1_000_000);
        Self((deadline % 9_000_000_000_000 * 1_000_000 + random).to_string())
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    fn time_left(value: &[u8]) -> Option<Duration> {
        let v: u64 = std::str::from_utf8(value).ok()?.parse().ok()?;
        let deadline = v / 1_000_000;
        Some(Duration::from_millis(deadline.saturating_sub(now_ms())))
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(0))
}

/// A fingerprint's place, held by one request.
///
/// Call [`finish`](Self::finish) when the handler is done. Dropped without
/// it (the request future was dropped), the key is released in a short task
/// unless the policy holds keys always.
#[derive(Debug)]
pub struct Lease<S: Store + Clone> {
    store: S,
    key: String,
    owner: Option<Owner>,
    window: Duration,
    policy: ReleasePolicy,
}

impl<S: Store + Clone> Lease<S> {
    fn held(g: &FingerprintGuard<S>, key: String, owner: Owner) -> Self {
        Self {
            store: g.store.clone(),
            key,
            owner: Some(owner),
            window: g.window,
            policy: g.release,
        }
    }

    fn unheld(g: &FingerprintGuard<S>) -> Self {
        Self {
            store: g.store.clone(),
            key: String::new(),
            owner: None,
            window: g.window,
            policy: g.release,
        }
    }

    /// The store key this lease holds (empty when admitted without a store).
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Whether the lease holds a key (false when admitted fail-open).
    #[must_use]
    pub fn is_held(&self) -> bool {
        self.owner.is_some()
    }

    /// Extends the key to a full window from now, if this lease still owns
    /// it. Returns whether it did.
    ///
    /// # Errors
    /// When the store fails.
    pub async fn renew(&self) -> Result<bool, StoreError> {
        let Some(owner) = &self.owner else {
            return Ok(false);
        };
        let renewed = self
            .store
            .expire_if_equals(&self.key, owner.as_bytes(), self.window)
            .await?;
        metrics::counter!("norepeat_lease_renewals_total", "renewed" => if renewed { "yes" } else { "lost" }).increment(1);
        Ok(renewed)
    }

    /// The handler is done: hold or release the key per the policy.
    pub async fn finish(mut self, success: bool) {
        let release = match self.policy {
            ReleasePolicy::HoldOnSuccess => !success,
            ReleasePolicy::ReleaseOnCompletion => true,
            ReleasePolicy::HoldAlways => false,
        };
        let owner = self.owner.take();
        if let (true, Some(owner)) = (release, owner) {
            if let Err(e) = self
                .store
                .delete_if_equals(&self.key, owner.as_bytes())
                .await
            {
                tracing::warn!(error = %e, "could not release a fingerprint key; it expires with its window");
            }
        }
    }
}

impl<S: Store + Clone> Drop for Lease<S> {
    fn drop(&mut self) {
        let Some(owner) = self.owner.take() else {
            return;
        };
        if self.policy == ReleasePolicy::HoldAlways {
            return;
        }
        // The request was dropped mid-handler: treat it as a failure. The
        // task ends as soon as the (time-budgeted) store call does.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let store = self.store.clone();
            let key = std::mem::take(&mut self.key);
            rt.spawn(async move {
                let _ = store.delete_if_equals(&key, owner.as_bytes()).await;
            });
        }
    }
}
