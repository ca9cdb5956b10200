//! One-time repeat tokens: the signer ([`TokenSigner`]), the guard that
//! consumes each token once ([`TokenGuard`]) and its tower layer
//! ([`TokenLayer`]).
//!
//! The page fetches a token, the submit consumes it: good for pages and
//! forms.
//!
//! # Why signed, stateless tokens
//!
//! A token is `version | expiry | nonce | MAC`, 37 bytes in base64url. The MAC
//! (keyed BLAKE3, 128 bits) binds the token to the user it was issued to and
//! to its expiry, so a forged, altered, expired or borrowed token is refused
//! *without asking the store*. The store only records that a token was
//! *used*: one `SET NX PX` of a marker that lives for the token's whole life
//! plus a clock-skew allowance (see [`TokenGuard::clock_skew`]). Three things
//! follow:
//!
//! - Issuing writes nothing, so a flood of token requests cannot fill Redis.
//!   The only keys are markers of tokens already consumed by a submission, and
//!   each expires one token life and the skew allowance after its use: the
//!   number a user can hold in the store is capped by their submissions
//!   within that time, which the rate limiter bounds.
//! - A token can be issued and checked while Redis is down; its one use is
//!   then recorded in the local fallback store (see [`crate::degrade`]).
//! - Every instance that shares the secret accepts every other's tokens.
//!
//! The price: the secret must be shared by every instance and kept secret
//! (the demo shop keeps it in its database).
//!
//! # Clocks that differ
//! Each instance checks a token's expiry against its own clock, so an
//! instance whose clock is 30 s behind accepts a token 30 s longer than one
//! whose clock is right. The used-marker must outlive that last acceptance:
//! were it to live "expiry minus this instance's clock", the instance with
//! the fast clock would write a marker that is gone while the slow one
//! still takes the token, and both would accept it. So the marker lives for
//! the token's whole life plus an allowance for the skew between any two
//! instances' clocks (60 s by default, [`TokenGuard::clock_skew`]).
//!
//! ```
//! use norepeat::token::{TokenSigner, TokenError};
//! use std::time::Duration;
//! let signer = TokenSigner::new([7; 32]);
//! let t = signer.issue("u1", Duration::from_secs(60));
//! assert!(signer.verify("u1", &t.token).is_ok());
//! assert_eq!(signer.verify("u2", &t.token).unwrap_err(), TokenError::Invalid);
//! ```

use crate::clock::{Clock, SystemClock};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use std::sync::Arc;
use std::time::Duration;

mod guard;
mod layer;

pub use crate::middleware::ResponseBody;
pub use guard::{TokenGuard, TokenGuardError};
pub use layer::{NotReached, Token, TokenLayer, presented};

const VERSION: u8 = 1;
const NONCE: usize = 12;
const MAC: usize = 16;
const RAW_LEN: usize = 1 + 8 + NONCE + MAC;
/// Length of a token in characters.
pub const TOKEN_LEN: usize = (RAW_LEN * 4).div_ceil(3);

/// Why a token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// Not a token of ours, altered, or issued to another user.
    #[error("unknown or invalid repeat token")]
    Invalid,
    /// Its life is over.
    #[error("repeat token expired")]
    Expired,
    /// It was already used.
    #[error("repeat token already used")]
    Used,
}

/// A freshly issued token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedToken {
    /// The opaque token to hand to the client.
    pub token: String,
    /// How long it is good for.
    pub expires_in: Duration,
}

/// A token whose MAC and expiry checked out; its use is not recorded yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifiedToken {
    /// The token's random nonce: what the used-marker's key is made of.
    pub nonce: [u8; NONCE],
    /// Time left before it expires, by this instance's clock.
    pub remaining: Duration,
}

/// Issues and verifies tokens with one secret.
#[derive(Clone)]
pub struct TokenSigner {
    key: [u8; 32],
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for TokenSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenSigner(..)")
    }
}

impl TokenSigner {
    /// A signer with a 256-bit secret. Every instance that must accept the
    /// same tokens needs the same secret.
    #[must_use]
    pub fn new(secret: [u8; 32]) -> Self {
        Self {
            key: secret,
            clock: Arc::new(SystemClock),
        }
    }

    /// Reads the time from `clock` (default: the system's), for tests that
    /// run instances whose clocks differ.
    ///
    /// ```
    /// use norepeat::token::{TokenError, TokenSigner};
    /// use std::time::Duration;
    /// let early = TokenSigner::new([7; 32]).with_clock(|| 1_000_000);
    /// let late = TokenSigner::new([7; 32]).with_clock(|| 1_000_000 + 61_000);
    /// let t = early.issue("u1", Duration::from_secs(60));
    /// assert!(early.verify("u1", &t.token).is_ok());
    /// assert_eq!(late.verify("u1", &t.token), Err(TokenError::Expired));
    /// ```
    #[must_use]
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// A signer with a random secret: for a single instance, or tests.
    #[must_use]
    pub fn random() -> Self {
        Self::new(rand::random())
    }

    fn mac(&self, user: &str, expiry: &[u8], nonce: &[u8]) -> [u8; MAC] {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(b"norepeat token v1");
        h.update(expiry);
        h.update(nonce);
        h.update(&(user.len() as u64).to_le_bytes());
        h.update(user.as_bytes());
        let mut out = [0; MAC];
        out.copy_from_slice(&h.finalize().as_bytes()[..MAC]);
        out
    }

    /// Issues a token for `user`, good for `ttl`.
    #[must_use]
    pub fn issue(&self, user: &str, ttl: Duration) -> IssuedToken {
        let expiry = self
            .clock
            .now_ms()
            .saturating_add(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
            .to_le_bytes();
        // `rand::fill`, not `rand::random()`: an array of bytes from
        // `random` draws a word per byte.
        let mut nonce = [0u8; NONCE];
        rand::fill(&mut nonce[..]);
        let mut raw = [0u8; RAW_LEN];
        raw[0] = VERSION;
        raw[1..9].copy_from_slice(&expiry);
        raw[9..9 + NONCE].copy_from_slice(&nonce);
        raw[9 + NONCE..].copy_from_slice(&self.mac(user, &expiry, &nonce));
        IssuedToken {
            token: URL_SAFE_NO_PAD.encode(raw),
            expires_in: ttl,
        }
    }

    /// Checks a token's form, MAC (against `user`) and expiry, without any
    /// store. Recording its use is the caller's next step.
    ///
    /// # Errors
    /// [`TokenError::Invalid`] or [`TokenError::Expired`].
    pub fn verify(&self, user: &str, token: &str) -> Result<VerifiedToken, TokenError> {
        if token.len() != TOKEN_LEN {
            return Err(TokenError::Invalid);
        }
        let mut raw = [0u8; RAW_LEN];
        match URL_SAFE_NO_PAD.decode_slice(token, &mut raw) {
            Ok(RAW_LEN) => {}
            _ => return Err(TokenError::Invalid),
        }
        if raw[0] != VERSION {
            return Err(TokenError::Invalid);
        }
        let (expiry, rest) = raw[1..].split_at(8);
        let (nonce, mac) = rest.split_at(NONCE);
        let expected = self.mac(user, expiry, nonce);
        // Constant-time comparison: the MAC is a secret-derived value.
        if !constant_time_eq(&expected, mac) {
            return Err(TokenError::Invalid);
        }
        let mut e = [0u8; 8];
        e.copy_from_slice(expiry);
        let remaining = u64::from_le_bytes(e).saturating_sub(self.clock.now_ms());
        if remaining == 0 {
            return Err(TokenError::Expired);
        }
        let mut n = [0u8; NONCE];
        n.copy_from_slice(nonce);
        Ok(VerifiedToken {
            nonce: n,
            remaining: Duration::from_millis(remaining),
        })
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_bound_to_user_secret_and_form() {
        let s = TokenSigner::new([1; 32]);
        let t = s.issue("alice", Duration::from_secs(60)).token;
        assert_eq!(t.len(), TOKEN_LEN);
        assert!(s.verify("alice", &t).is_ok());
        assert_eq!(s.verify("bob", &t), Err(TokenError::Invalid));
        assert_eq!(
            TokenSigner::new([2; 32]).verify("alice", &t),
            Err(TokenError::Invalid)
        );
        let mut altered = t.clone().into_bytes();
        altered[10] = if altered[10] == b'A' { b'B' } else { b'A' };
        let altered = String::from_utf8(altered).unwrap();
        assert_eq!(s.verify("alice", &altered), Err(TokenError::Invalid));
        assert_eq!(s.verify("alice", "short"), Err(TokenError::Invalid));
        assert_eq!(
            s.verify("alice", &"x".repeat(10_000)),
            Err(TokenError::Invalid)
        );
    }

    #[test]
    fn expired_tokens_are_refused() {
        let s = TokenSigner::new([1; 32]);
        let t = s.issue("alice", Duration::ZERO).token;
        assert_eq!(s.verify("alice", &t), Err(TokenError::Expired));
    }

    #[test]
    fn two_tokens_differ() {
        let s = TokenSigner::random();
        let ttl = Duration::from_secs(1);
        assert_ne!(s.issue("a", ttl).token, s.issue("a", ttl).token);
    }
}
