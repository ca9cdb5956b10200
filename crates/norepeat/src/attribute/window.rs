//! Window mode: a repeat within the window is refused, by the fingerprint
//! guard's rules keyed by the key string.

use super::{GuardMode, Guarded, Rejected};
use crate::fingerprint::{Digest, FingerprintGuard, FingerprintGuardError, ReleasePolicy};
use crate::store::Store;
use std::future::Future;

/// A body running past the window keeps its key by renewal up to this many
/// windows.
const RENEW_WINDOWS: u32 = 10;

impl Guarded {
    pub(super) fn fingerprint(&self, key: &str) -> Digest {
        let mut h = blake3::Hasher::new();
        crate::keys::feed_parts(
            &mut h,
            &[b"norepeat::window", self.scope.as_bytes(), key.as_bytes()],
        );
        Digest(*h.finalize().as_bytes())
    }

    fn fingerprint_guard<S: Store + Clone>(&self, store: S) -> FingerprintGuard<S> {
        let window = match self.mode {
            GuardMode::Window(w) => w,
            GuardMode::Once { lease, .. } => lease,
        };
        FingerprintGuard::for_one_call(store)
            .window(window)
            .release(ReleasePolicy::HoldOnSuccess)
            .on_store_failure(self.failure)
            .renew_up_to(window * RENEW_WINDOWS)
            .keys(self.keys.clone())
    }

    /// Window mode: runs `body` unless `key` was used within the window.
    /// (In once mode this behaves as a window of the lease's length; use
    /// [`run_once`](Self::run_once) there.)
    ///
    /// # Errors
    /// The body's error, or `E::from(`[`Rejected`]`)`: `Duplicate` within the
    /// window, `Unavailable` when the store fails and the policy fails closed.
    pub async fn run_window<S, T, E, F>(&self, store: &S, key: &str, body: F) -> Result<T, E>
    where
        S: Store + Clone,
        E: From<Rejected>,
        F: Future<Output = Result<T, E>>,
    {
        let guard = self.fingerprint_guard(store.clone());
        let claim = match guard.acquire(&self.fingerprint(key)).await {
            Ok(claim) => claim,
            Err(e) => return Err(E::from(Rejected::from(e))),
        };
        // Renewal (up to RENEW_WINDOWS windows) lives in this future. Dropped
        // mid-body, the claim keeps its key for the rest of the window.
        let out = claim.run(body).await;
        claim.finish(out.is_ok()).await;
        out
    }
}

impl From<FingerprintGuardError> for Rejected {
    /// `Duplicate` with the time left in whole seconds (at least 1), or
    /// `Unavailable`.
    fn from(e: FingerprintGuardError) -> Self {
        match e {
            FingerprintGuardError::Duplicate { retry_after } => {
                let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
                Rejected::Duplicate {
                    retry_after: std::time::Duration::from_secs(secs.max(1)),
                }
            }
            FingerprintGuardError::Unavailable(e) => Rejected::from(e),
        }
    }
}
