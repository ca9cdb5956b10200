//! The token guard.

use super::fingerprint::store_failure;
use crate::degrade::FailurePolicy;
use crate::keys::{KeyBuilder, Mode};
use crate::problem::{Code, Problem};
use crate::store::KeyValueStoreExt;
use crate::store::Store;
use crate::token::{IssuedToken, TokenError, TokenSigner};
use std::time::Duration;

/// Issues one-time tokens and consumes them, once, atomically.
///
/// See [`crate::token`] for why tokens are signed and stateless.
///
/// ```
/// use norepeat::guard::TokenGuard;
/// use norepeat::store::MemoryStore;
/// use norepeat::token::TokenSigner;
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let guard = TokenGuard::new(MemoryStore::default(), TokenSigner::random());
/// let t = guard.issue("u1");
/// assert!(guard.consume("u1", &t.token).await.is_ok());
/// let again = guard.consume("u1", &t.token).await.unwrap_err();
/// assert_eq!(again.code.as_str(), "duplicate_submission");
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct TokenGuard<S> {
    store: S,
    keys: KeyBuilder,
    signer: TokenSigner,
    ttl: Duration,
    failure: FailurePolicy,
}

impl<S: Store + Clone> TokenGuard<S> {
    /// Tokens living 60 s, fail-open.
    #[must_use]
    pub fn new(store: S, signer: TokenSigner) -> Self {
        Self {
            store,
            keys: KeyBuilder::default(),
            signer,
            ttl: Duration::from_secs(60),
            failure: FailurePolicy::FailOpen,
        }
    }

    /// How long a token lives.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// What to do when the store fails. With a [`crate::degrade::Fallback`]
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

    /// The life of a token.
    #[must_use]
    pub fn token_ttl(&self) -> Duration {
        self.ttl
    }

    /// Issues a token for `user`. Touches no store.
    #[must_use]
    pub fn issue(&self, user: &str) -> IssuedToken {
        metrics::counter!("norepeat_tokens_issued_total").increment(1);
        self.signer.issue(user, self.ttl)
    }

    /// Consumes `token` for `user`: checks it without the store, then records
    /// its one use with one `SET NX PX`.
    ///
    /// # Errors
    /// 409 `duplicate_submission` when the token is used, expired, unknown or
    /// another user's; 503 `guard_unavailable` when the store fails and the
    /// policy fails closed.
    pub async fn consume(&self, user: &str, token: &str) -> Result<(), Problem> {
        let reject = |why: TokenError| {
            metrics::counter!("norepeat_decisions_total", "mode" => "token", "outcome" => "rejected", "reason" => reason(why)).increment(1);
            Err(Problem::new(Code::DuplicateSubmission).detail(detail(why)))
        };
        let verified = match self.signer.verify(user, token) {
            Ok(v) => v,
            Err(why) => return reject(why),
        };
        let key = self.keys.key(Mode::Token, &[&verified.nonce]);
        match self
            .store
            .put_if_absent(&key, b"1", verified.remaining)
            .await
        {
            Ok(None) => {
                metrics::counter!("norepeat_decisions_total", "mode" => "token", "outcome" => "admitted").increment(1);
                Ok(())
            }
            Ok(Some(_)) => reject(TokenError::Used),
            Err(e) => store_failure("token", self.failure, &e),
        }
    }
}

fn reason(e: TokenError) -> &'static str {
    match e {
        TokenError::Used => "used",
        TokenError::Expired => "expired",
        _ => "invalid",
    }
}

fn detail(e: TokenError) -> &'static str {
    match e {
        TokenError::Used => "This form was already submitted. Reload to get a new token.",
        TokenError::Expired => "The repeat token expired. Reload to get a new one.",
        _ => "The repeat token is unknown or belongs to another user.",
    }
}
