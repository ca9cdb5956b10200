//! Where the guards keep their state: the store traits, their backends, and
//! the wrappers that keep a backend usable when it fails.
//!
//! Every operation is one atomic state change. On Redis each is one command
//! or one Lua script (the scripts live in `src/store/redis/lua/`, one file each,
//! with their `KEYS` and `ARGV` documented); in memory each is one per-key
//! critical section; in SQL one statement. Nothing here reads a value and
//! then writes it in a second step, nothing deletes a key without checking
//! who owns it, and every key is written with a time to live.
//!
//! Backends:
//! - [`MemoryStore`]: bounded, TTL-expiring, in-process. The embedded default
//!   and the local fallback during an outage.
//! - [`RedisStore`] (feature `redis`): one Redis through reconnecting
//!   multiplexed connections.
//! - [`ClusterStore`] (feature `redis`): Redis Cluster.
//! - [`AnyStore`]: one of the above, chosen at run time (for example from a URL).
//! - `SqlStore` (features `postgres`, `sqlite`): a table in PostgreSQL or
//!   SQLite. It keeps records but has no rate algorithms, so it is a
//!   [`KeyValueStore`] and not a [`RateStore`].
//!
//! Wrappers, each a store in front of a store (the shape of a cache in
//! front of a store):
//! - [`Resilient`]: a time budget on every call and a [`Breaker`] in front.
//! - [`Fallback`]: answers from a bounded local [`MemoryStore`] whenever the
//!   primary fails.
//!
//! # The traits: one operation enum per kind of work
//! A backend implements one method per kind of work, taking an operation
//! enum, as redis-rs's `ConnectionLike` takes a command:
//!
//! - [`KeyValueStore::execute`] runs a [`KeyOp`], one of the four
//!   conditional key-value operations (what claims, tokens and idempotency
//!   records need). It also names the backend ([`KeyValueStore::kind`])
//!   and can reconnect it ([`KeyValueStore::reconnect`]).
//! - [`RateStore::rate`] runs a [`RateOp`], one of the three rate
//!   algorithms (what a rate limiter needs).
//! - [`Store`] is both: what a guard or limiter asks for. It is implemented
//!   for every type that is both.
//!
//! The typed calls (`put_if_absent`, `gcra`, ...) come from the extension
//! traits [`KeyValueStoreExt`] and [`RateStoreExt`], implemented for every
//! store; import them (or `use norepeat::store::prelude::*`) to call a store.
//!
//! Why this shape: most implementations of a store are wrappers (a time
//! budget, a breaker, a fallback, a fault injector, a type-erased store),
//! and a wrapper does the same thing around every operation. With one
//! method per operation each wrapper had to forward nine methods, and a new
//! operation meant an edit in every wrapper. Now a wrapper implements
//! `execute` and `rate` once, and a new operation is one variant, one typed
//! call, and one arm in each real backend. The split into two traits keeps
//! a store that cannot count rates (a SQL table) from being handed to a
//! rate limiter: the compiler refuses it.
//!
//! ```
//! use norepeat::store::{KeyValueStoreExt, MemoryStore};
//! use std::time::Duration;
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), norepeat::store::StoreError> {
//! let store = MemoryStore::new(10_000);
//! let ttl = Duration::from_secs(3);
//! assert_eq!(store.put_if_absent("k", b"owner-a", ttl).await?, None);
//! // Someone else holds it: we learn who, and nothing changes.
//! assert_eq!(store.put_if_absent("k", b"owner-b", ttl).await?.as_deref(), Some(&b"owner-a"[..]));
//! // Only the owner can delete it.
//! assert!(!store.delete_if_equals("k", b"owner-b").await?);
//! assert!(store.delete_if_equals("k", b"owner-a").await?);
//! # Ok(()) }
//! ```

mod any;
mod memory;
#[cfg(feature = "redis")]
mod redis;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub mod sql;

mod breaker;
mod fallback;
mod key_value;
pub mod rate;
mod recent;
mod resilient;

pub use breaker::{Breaker, BreakerState, Permit};
pub use fallback::Fallback;
pub use key_value::{
    DecidedBy, KeyOp, KeyReply, KeyValueStore, KeyValueStoreExt, LateAnswers, ReadStoreExt,
};
pub(crate) use key_value::{put_if_absent_decided, replace_if_equals_decided};
pub use rate::{RateDecision, RateOp, RateStore, RateStoreExt};
pub use resilient::Resilient;

/// The store traits and their typed calls, to import at once:
/// `use norepeat::store::prelude::*;`.
pub mod prelude {
    pub use super::{KeyValueStore, KeyValueStoreExt, RateStore, RateStoreExt, Store};
}

pub use any::AnyStore;
pub use memory::MemoryStore;
#[cfg(feature = "redis")]
pub use redis::{ClusterStore, DEFAULT_CONNECTIONS, RedisStore};
#[cfg(feature = "postgres")]
pub use sql::PgStore;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub use sql::SqlStore;
#[cfg(feature = "sqlite")]
pub use sql::SqliteStore;

use std::time::Duration;

/// Why a store call failed.
///
/// A failure is never a decision: a guard that gets one does not answer
/// "duplicate", it applies its route's failure policy instead.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store did not answer within its time budget.
    #[error("store call timed out after {0:?}")]
    Timeout(Duration),
    /// The circuit breaker is open: the store was not asked.
    #[error("store circuit breaker is open")]
    CircuitOpen,
    /// The connection failed or was refused.
    #[error("store connection failed: {0}")]
    Connection(String),
    /// The store answered with an error (for example `OOM` or `READONLY`).
    #[error("store answered with an error: {0}")]
    Server(String),
    /// The store answered something this crate does not understand.
    #[error("unexpected answer from store: {0}")]
    Protocol(String),
    /// The write was made on the master, but fewer of its replicas than
    /// the store asks for (`?replicas=N`) acknowledged it in time: a
    /// failover now could lose it. A store failure, for the route's
    /// policy; a guard that refuses its request for it takes its claim
    /// back.
    #[error("store write not acknowledged by enough replicas: {0}")]
    NotReplicated(String),
    /// The store's URL is not one this crate can use: nothing was sent.
    /// The message names the URL (its password replaced by `***`, see
    /// [`redact_url`]) and how a good one looks.
    #[error("invalid store URL: {0}")]
    InvalidUrl(String),
}

impl StoreError {
    /// Whether the write this error answers may be in the store all the
    /// same: no answer came ([`Timeout`](Self::Timeout),
    /// [`Connection`](Self::Connection): the command may have left), or it
    /// was made on the master without enough replicas' acknowledgement
    /// ([`NotReplicated`](Self::NotReplicated)). A server's refusal, an
    /// open breaker or a bad URL wrote nothing.
    ///
    /// ```
    /// use norepeat::store::StoreError;
    /// assert!(StoreError::NotReplicated("0 had it".into()).may_have_landed());
    /// assert!(!StoreError::CircuitOpen.may_have_landed());
    /// ```
    #[must_use]
    pub fn may_have_landed(&self) -> bool {
        matches!(
            self,
            Self::Timeout(_) | Self::Connection(_) | Self::NotReplicated(_)
        )
    }
}

/// `url` with its password replaced by `***`, for errors and logs: the
/// password of the user part (`scheme://user:password@host`) and a
/// `password=` query parameter (as PostgreSQL URLs allow). A URL without
/// either is returned as it is.
///
/// ```
/// use norepeat::store::redact_url;
/// assert_eq!(redact_url("redis://:s3cret@cache:6379/0"), "redis://:***@cache:6379/0");
/// assert_eq!(redact_url("postgres://shop:s3cret@db/shop"), "postgres://shop:***@db/shop");
/// assert_eq!(redact_url("postgres://db/shop?user=a&password=s3cret"), "postgres://db/shop?user=a&password=***");
/// assert_eq!(redact_url("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
/// ```
#[must_use]
pub fn redact_url(url: &str) -> std::borrow::Cow<'_, str> {
    let mut out = String::new();
    let mut rest = url;
    if let Some(scheme_end) = url.find("://") {
        let authority_start = scheme_end + 3;
        let authority_end = url[authority_start..]
            .find(['/', '?', '#'])
            .map_or(url.len(), |i| authority_start + i);
        let authority = &url[authority_start..authority_end];
        if let Some(at) = authority.rfind('@')
            && let Some(colon) = authority[..at].find(':')
        {
            out.push_str(&url[..authority_start + colon + 1]);
            out.push_str("***");
            rest = &url[authority_start + at..];
        }
    }
    if let Some(query) = rest.find('?') {
        let (head, tail) = rest.split_at(query);
        let mut redacted = String::with_capacity(tail.len());
        for (i, pair) in tail[1..].split('&').enumerate() {
            redacted.push(if i == 0 { '?' } else { '&' });
            match pair.split_once('=') {
                Some((name, _)) if name.eq_ignore_ascii_case("password") => {
                    redacted.push_str(name);
                    redacted.push_str("=***");
                }
                _ => redacted.push_str(pair),
            }
        }
        if redacted != tail {
            out.push_str(head);
            out.push_str(&redacted);
            rest = "";
        }
    }
    if out.is_empty() {
        return std::borrow::Cow::Borrowed(url);
    }
    out.push_str(rest);
    std::borrow::Cow::Owned(out)
}

/// Everything a guard or a rate limiter asks of a backend: a
/// [`KeyValueStore`] that is also a [`RateStore`]. Implemented for every
/// such type; implement those two traits, not this one.
///
/// ```
/// use norepeat::store::{MemoryStore, Store};
/// fn shared<S: Store + Clone>(store: &S) -> S { store.clone() }
/// let _ = shared(&MemoryStore::default());
/// ```
pub trait Store: KeyValueStore + RateStore {}

impl<S: KeyValueStore + RateStore> Store for S {}

/// Milliseconds in `d`, at least 1 (Redis refuses `PX 0`) and at most
/// [`LONGEST_TTL_MS`] (Redis refuses a `PX` whose deadline overflows, so
/// `Duration::MAX` as a lease or a retention becomes some 285,000 years).
#[cfg_attr(
    not(any(feature = "redis", feature = "postgres", feature = "sqlite")),
    allow(dead_code)
)]
pub(crate) fn ttl_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis())
        .unwrap_or(u64::MAX)
        .clamp(1, LONGEST_TTL_MS)
}

/// The longest TTL a store writes, in milliseconds: 2^53 (exact in a
/// double, as Lua and JSON hold numbers; added to today's time in
/// milliseconds it overflows neither Redis's nor SQL's 64 bits).
#[cfg_attr(
    not(any(feature = "redis", feature = "postgres", feature = "sqlite")),
    allow(dead_code)
)]
pub(crate) const LONGEST_TTL_MS: u64 = 1 << 53;
