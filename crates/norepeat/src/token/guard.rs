//! The token guard: issues tokens and consumes each once, and says why it
//! refused one ([`TokenGuardError`]).

use super::{IssuedToken, TokenError, TokenSigner};
use crate::degrade::FailurePolicy;
use crate::keys::{KeyBuilder, Namespace};
use crate::store::{DecidedBy, KeyValueStoreExt, Store, StoreError, put_if_absent_decided};
use std::time::Duration;

/// Why [`TokenGuard::consume`] refused a token. The layer answers it as a
/// [`Problem`](crate::problem::Problem) (`From` is in its
/// `layer.rs`, at the HTTP edge).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenGuardError {
    /// The token was already used (409 `duplicate_submission`).
    #[error("repeat token already used")]
    Used,
    /// The token's life is over (409 `token_expired`: fetch a new one).
    #[error("repeat token expired")]
    Expired,
    /// Not a token of ours, altered, or another user's (409
    /// `duplicate_submission`).
    #[error("unknown or invalid repeat token")]
    Invalid,
    /// The store failed and the guard fails closed (503
    /// `guard_unavailable`).
    #[error("the token guard's store is unavailable: {0}")]
    Unavailable(#[source] StoreError),
}

impl From<TokenError> for TokenGuardError {
    fn from(e: TokenError) -> Self {
        match e {
            TokenError::Used => TokenGuardError::Used,
            TokenError::Expired => TokenGuardError::Expired,
            _ => TokenGuardError::Invalid,
        }
    }
}

/// Issues one-time tokens and consumes them, once, atomically.
///
/// See [`crate::token`] for why tokens are signed and stateless.
///
/// ```
/// use norepeat::store::MemoryStore;
/// use norepeat::token::{TokenGuard, TokenGuardError, TokenSigner};
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let guard = TokenGuard::new(MemoryStore::default(), TokenSigner::random());
/// let t = guard.issue("u1");
/// assert!(guard.consume("u1", &t.token).await.is_ok());
/// let again = guard.consume("u1", &t.token).await.unwrap_err();
/// assert!(matches!(again, TokenGuardError::Used));
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct TokenGuard<S> {
    store: S,
    keys: KeyBuilder,
    signer: TokenSigner,
    ttl: Duration,
    skew: Duration,
    failure: FailurePolicy,
}

impl<S: Store + Clone> TokenGuard<S> {
    /// Tokens living 60 s, a clock-skew allowance of 60 s, fail-open.
    #[must_use]
    pub fn new(store: S, signer: TokenSigner) -> Self {
        Self {
            store,
            keys: KeyBuilder::default(),
            signer,
            ttl: Duration::from_secs(60),
            skew: Duration::from_secs(60),
            failure: FailurePolicy::FailOpen,
        }
    }

    /// How far apart the clocks of the instances sharing the store may be
    /// (default 60 s). A used token's marker lives for the token's whole
    /// life plus this, so an instance whose clock is behind, and still
    /// takes the token for valid, finds the marker (see
    /// [`crate::token`], "Clocks that differ").
    #[must_use]
    pub fn clock_skew(mut self, skew: Duration) -> Self {
        self.skew = skew;
        self
    }

    /// How long a token lives.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// What to do when the store fails. With a [`crate::store::Fallback`]
    /// store, fail-open still consumes each token once per instance.
    #[must_use]
    pub fn on_store_failure(mut self, policy: FailurePolicy) -> Self {
        self.failure = policy;
        self
    }

    /// The key prefix and layout.
    #[must_use]
    pub fn keys(mut self, keys: KeyBuilder) -> Self {
        self.keys = keys;
        self
    }

    /// The life of a token (set with [`ttl`](Self::ttl)).
    #[must_use]
    pub fn get_ttl(&self) -> Duration {
        self.ttl
    }

    /// Issues a token for `user`. Touches no store.
    #[must_use]
    pub fn issue(&self, user: &str) -> IssuedToken {
        metrics::counter!("norepeat_tokens_issued_total").increment(1);
        self.signer.issue(user, self.ttl)
    }

    /// Consumes `token` for `user`: checks it without the store, then records
    /// its one use with one `SET NX PX` of a marker living the token's life
    /// plus the [clock-skew allowance](Self::clock_skew).
    ///
    /// # Errors
    /// [`TokenGuardError::Used`], [`Expired`](TokenGuardError::Expired) or
    /// [`Invalid`](TokenGuardError::Invalid) (unknown, altered or another
    /// user's); [`Unavailable`](TokenGuardError::Unavailable) when the store
    /// fails and the policy fails closed.
    pub async fn consume(&self, user: &str, token: &str) -> Result<(), TokenGuardError> {
        self.consume_decided(user, token).await.map(drop)
    }

    /// Gives back a use that [`consume_decided`](Self::consume_decided)
    /// recorded, owner-checked (the marker must still be this use's): the
    /// request never reached its effect, so the token stays good for its
    /// retry.
    pub(crate) async fn give_back(&self, used: &Used) {
        match self.store.delete_if_equals(&used.key, &used.marker).await {
            Ok(_) => {
                metrics::counter!("norepeat_tokens_given_back_total").increment(1);
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not give a token's use back; it stays used");
            }
        }
    }

    /// [`consume`](Self::consume), telling whether the use was recorded
    /// (`Some`, with what gives it back) or the store failed and the guard
    /// let the token through fail-open (`None`).
    pub(crate) async fn consume_decided(
        &self,
        user: &str,
        token: &str,
    ) -> Result<Option<Used>, TokenGuardError> {
        let reject = |why: TokenError| {
            let why = TokenGuardError::from(why);
            metrics::counter!("norepeat_decisions_total", "mode" => "token", "outcome" => "rejected", "reason" => reason(&why)).increment(1);
            Err(why)
        };
        let verified = match self.signer.verify(user, token) {
            Ok(v) => v,
            Err(why) => return reject(why),
        };
        let key = self.keys.key(Namespace::Token, &[&verified.nonce]);
        // Not `verified.remaining`: that is this instance's view, and an
        // instance with a slower clock takes the token for longer. A token
        // signed for more than this guard's `ttl` (by another issuer) is
        // covered by `remaining`.
        let marker_life = self.ttl.max(verified.remaining).saturating_add(self.skew);
        // Unique per use, so that only this use can be given back. A
        // decimal that Redis keeps as an integer (no string allocation).
        let marker = itoa::Buffer::new()
            .format(rand::random_range(1_000_000_000u64..u64::MAX / 2))
            .as_bytes()
            .to_vec();
        match put_if_absent_decided(&self.store, &key, &marker, marker_life).await {
            Ok((None, by)) => {
                metrics::counter!("norepeat_decisions_total", "mode" => "token", "outcome" => "admitted").increment(1);
                let local = by == DecidedBy::LocalMemory;
                Ok(Some(Used { key, marker, local }))
            }
            Ok((Some(_), _)) => reject(TokenError::Used),
            // Refused: a use recorded all the same would spend the token
            // its retry needs.
            Err(e) => crate::claim::on_claim_error(
                "token",
                self.failure,
                e,
                &self.store,
                key.into(),
                marker.into(),
                None,
            )
            .map(|()| None)
            .map_err(TokenGuardError::Unavailable),
        }
    }
}

/// A token's recorded use: its marker's key and value.
#[derive(Debug)]
pub(crate) struct Used {
    key: String,
    marker: Vec<u8>,
    /// Recorded in the local memory of a store that failed.
    pub(crate) local: bool,
}

fn reason(e: &TokenGuardError) -> &'static str {
    match e {
        TokenGuardError::Used => "used",
        TokenGuardError::Expired => "expired",
        _ => "invalid",
    }
}
