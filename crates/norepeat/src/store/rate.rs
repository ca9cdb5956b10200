//! The rate half of a store: the three rate algorithms, their answer, and
//! the arithmetic every backend mirrors.

pub mod arithmetic;

use super::{DecidedBy, KeyValueStore, StoreError};
use std::future::Future;
use std::time::Duration;

/// The answer of a rate limiter's store call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateDecision {
    /// Whether this request is admitted.
    pub allowed: bool,
    /// Requests still allowed in the current state (0 when rejected).
    pub remaining: u64,
    /// When rejected: how long until a request would be admitted. When
    /// admitted: how long until the limiter is back to its full allowance.
    pub reset: Duration,
}

/// One rate algorithm's step for one key, as a backend receives it.
///
/// Each counts one request and decides it in one atomic step, timed by the
/// store's clock (Redis `TIME`), with the arithmetic of [`arithmetic`].
/// Call them through [`RateStoreExt`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RateOp<'a> {
    /// Fixed window: counts this request in the window `key` names and
    /// admits it while the count stays within `limit`. The counter expires
    /// with its window.
    FixedWindow {
        /// The key.
        key: &'a str,
        /// Requests admitted per window.
        limit: u64,
        /// The window.
        window: Duration,
    },
    /// Sliding window (two weighted fixed windows): admits the request while
    /// `previous * (1 - elapsed/window) + current < limit`.
    SlidingWindow {
        /// The key.
        key: &'a str,
        /// Requests admitted per window.
        limit: u64,
        /// The window.
        window: Duration,
    },
    /// GCRA: one stored number per key, the theoretical arrival time.
    Gcra {
        /// The key.
        key: &'a str,
        /// The interval between requests at the sustained rate.
        emission: Duration,
        /// How many may come at once.
        burst: u64,
    },
}

impl<'a> RateOp<'a> {
    /// The key the operation touches.
    #[must_use]
    pub fn key(&self) -> &'a str {
        match *self {
            RateOp::FixedWindow { key, .. }
            | RateOp::SlidingWindow { key, .. }
            | RateOp::Gcra { key, .. } => key,
        }
    }
}

/// A backend that counts rates: runs the three [`RateOp`]s.
///
/// Implement it beside [`KeyValueStore`]; a type that implements both is a
/// [`Store`](super::Store).
pub trait RateStore: KeyValueStore {
    /// Counts one request and decides it, atomically.
    fn rate(&self, op: RateOp<'_>)
    -> impl Future<Output = Result<RateDecision, StoreError>> + Send;

    /// Counts one request and decides it, as [`rate`](Self::rate), and says
    /// who decided: the store, or a local memory standing in for a store
    /// that failed. A wrapper that may hold a
    /// [`Fallback`](super::Fallback) must pass it on, as for
    /// [`KeyValueStore::execute_decided`].
    fn rate_decided(
        &self,
        op: RateOp<'_>,
    ) -> impl Future<Output = Result<(RateDecision, DecidedBy), StoreError>> + Send {
        async move { Ok((self.rate(op).await?, DecidedBy::Store)) }
    }
}

impl<S: RateStore> RateStore for std::sync::Arc<S> {
    fn rate(
        &self,
        op: RateOp<'_>,
    ) -> impl Future<Output = Result<RateDecision, StoreError>> + Send {
        (**self).rate(op)
    }
    fn rate_decided(
        &self,
        op: RateOp<'_>,
    ) -> impl Future<Output = Result<(RateDecision, DecidedBy), StoreError>> + Send {
        (**self).rate_decided(op)
    }
}

/// The typed calls of a [`RateStore`], one per [`RateOp`]. Implemented for
/// every rate store.
///
/// ```
/// use norepeat::store::{MemoryStore, RateStoreExt};
/// use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), norepeat::store::StoreError> {
/// let store = MemoryStore::default();
/// let window = Duration::from_secs(1);
/// assert!(store.fixed_window("u1", 1, window).await?.allowed);
/// assert!(!store.fixed_window("u1", 1, window).await?.allowed);
/// # Ok(()) }
/// ```
pub trait RateStoreExt: RateStore {
    /// Fixed window: see [`RateOp::FixedWindow`].
    fn fixed_window(
        &self,
        key: &str,
        limit: u64,
        window: Duration,
    ) -> impl Future<Output = Result<RateDecision, StoreError>> + Send {
        self.rate(RateOp::FixedWindow { key, limit, window })
    }

    /// Sliding window: see [`RateOp::SlidingWindow`].
    fn sliding_window(
        &self,
        key: &str,
        limit: u64,
        window: Duration,
    ) -> impl Future<Output = Result<RateDecision, StoreError>> + Send {
        self.rate(RateOp::SlidingWindow { key, limit, window })
    }

    /// GCRA: see [`RateOp::Gcra`].
    fn gcra(
        &self,
        key: &str,
        emission: Duration,
        burst: u64,
    ) -> impl Future<Output = Result<RateDecision, StoreError>> + Send {
        self.rate(RateOp::Gcra {
            key,
            emission,
            burst,
        })
    }
}

impl<S: RateStore + ?Sized> RateStoreExt for S {}
