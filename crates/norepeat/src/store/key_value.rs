// Over 400 lines on purpose: the operations, their replies, the trait and its typed calls (the public ones and the two that say who decided), which read as one contract.
//! The key-value half of a store: four conditional operations on one key.

use super::StoreError;
use bytes::Bytes;
use std::future::Future;
use std::time::Duration;

/// One conditional key-value operation, as a backend receives it.
///
/// Each is atomic against every other operation on the same key, from any
/// process sharing the store; an expired key is absent; no key is written
/// without an expiry. Call them through [`KeyValueStoreExt`], which gives
/// each its typed answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyOp<'a> {
    /// Store `value` under `key` for `ttl` if the key is absent
    /// (`SET key value NX PX ttl GET`). Answers [`KeyReply::Held`]: `None`
    /// when stored, else the value already there (unchanged).
    PutIfAbsent {
        /// The key.
        key: &'a str,
        /// The value to store.
        value: &'a [u8],
        /// Its time to live.
        ttl: Duration,
    },
    /// Delete `key` only if it still holds `expected`. Answers
    /// [`KeyReply::Changed`].
    DeleteIfEquals {
        /// The key.
        key: &'a str,
        /// The value it must hold.
        expected: &'a [u8],
    },
    /// Set a new `ttl` on `key` only if it still holds `expected`. Answers
    /// [`KeyReply::Changed`].
    ExpireIfEquals {
        /// The key.
        key: &'a str,
        /// The value it must hold.
        expected: &'a [u8],
        /// The new time to live.
        ttl: Duration,
    },
    /// Replace the value of `key` with `value` and a new `ttl` only if it
    /// still holds `expected`. Answers [`KeyReply::Changed`].
    ReplaceIfEquals {
        /// The key.
        key: &'a str,
        /// The value it must hold.
        expected: &'a [u8],
        /// The new value.
        value: &'a [u8],
        /// The new time to live.
        ttl: Duration,
    },
    /// Read the value of `key` (`GET key`), changing nothing. Answers
    /// [`KeyReply::Held`]: the value, or `None` when the key is absent or
    /// expired. For an operator looking at a record; no guard decides on a
    /// read (a read and then a write is two operations, not one).
    Get {
        /// The key.
        key: &'a str,
    },
}

impl<'a> KeyOp<'a> {
    /// The key the operation touches.
    #[must_use]
    pub fn key(&self) -> &'a str {
        match *self {
            KeyOp::PutIfAbsent { key, .. }
            | KeyOp::DeleteIfEquals { key, .. }
            | KeyOp::ExpireIfEquals { key, .. }
            | KeyOp::ReplaceIfEquals { key, .. }
            | KeyOp::Get { key } => key,
        }
    }

    /// A short name for logs and metrics (`"put_if_absent"`, ...).
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            KeyOp::PutIfAbsent { .. } => "put_if_absent",
            KeyOp::DeleteIfEquals { .. } => "delete_if_equals",
            KeyOp::ExpireIfEquals { .. } => "expire_if_equals",
            KeyOp::ReplaceIfEquals { .. } => "replace_if_equals",
            KeyOp::Get { .. } => "get",
        }
    }
}

/// A backend's answer to a [`KeyOp`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyReply {
    /// To [`KeyOp::PutIfAbsent`]: `None` when the value was stored, else the
    /// value that holds the key. To [`KeyOp::Get`]: the value, if any.
    Held(Option<Bytes>),
    /// To the conditional operations: whether the key held the expected
    /// value (and so was changed).
    Changed(bool),
}

/// A backend that keeps keys: runs the four [`KeyOp`]s.
///
/// Implement this (and [`RateStore`](super::RateStore) if the backend can
/// count rates) to add a backend or a wrapper; call a store through
/// [`KeyValueStoreExt`]. A backend that cannot run the rate algorithms,
/// such as `SqlStore` (features `postgres`, `sqlite`), implements only this
/// trait, so a rate limiter over it does not compile. Code that only claims
/// and completes records should ask for this trait.
///
/// ```
/// use norepeat::store::{KeyOp, KeyReply, KeyValueStore, KeyValueStoreExt, MemoryStore, StoreError};
/// use std::sync::atomic::{AtomicU64, Ordering};
///
/// /// A wrapper that counts the operations it forwards: one method, whatever the operation.
/// struct Counted { inner: MemoryStore, ops: AtomicU64 }
///
/// impl KeyValueStore for Counted {
///     async fn execute(&self, op: KeyOp<'_>) -> Result<KeyReply, StoreError> {
///         self.ops.fetch_add(1, Ordering::Relaxed);
///         self.inner.execute(op).await
///     }
///     fn kind(&self) -> &'static str { self.inner.kind() }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), StoreError> {
/// let store = Counted { inner: MemoryStore::default(), ops: AtomicU64::new(0) };
/// let ttl = std::time::Duration::from_secs(30);
/// assert_eq!(store.put_if_absent("order-7", b"a", ttl).await?, None);
/// assert_eq!(store.put_if_absent("order-7", b"b", ttl).await?.as_deref(), Some(&b"a"[..]));
/// assert_eq!(store.ops.load(Ordering::Relaxed), 2);
/// # Ok(()) }
/// ```
pub trait KeyValueStore: Send + Sync + 'static {
    /// Runs one operation, atomically.
    fn execute(&self, op: KeyOp<'_>) -> impl Future<Output = Result<KeyReply, StoreError>> + Send;

    /// A short name for logs and metrics (`"memory"`, `"redis"`,
    /// `"cluster"`, `"postgres"`, `"sqlite"`).
    fn kind(&self) -> &'static str;

    /// Drops the store's connections and makes fresh ones. Called by
    /// [`Resilient`](super::Resilient) after repeated timeouts with no
    /// answer at all (late or not) for a while, the sign of a connection
    /// whose replies will never come. The default does nothing.
    fn reconnect(&self) {}

    /// Asks the store to report, to `to`, the latency of each answer that
    /// arrives after its caller gave up (a call past its time budget whose
    /// command was already sent), an error answer (`OOM`) excepted.
    /// [`Resilient`](super::Resilient) asks this of the store it wraps, so
    /// that a store that turns slow raises its budget and closes its
    /// breaker while a store that is silent does neither. A wrapper must
    /// pass it on to the store it wraps (one that did not kept its store
    /// looking silent whenever it was slow); the default ignores it (a
    /// store that cannot tell).
    fn report_late_answers(&self, to: LateAnswers) {
        let _ = to;
    }

    /// Runs one operation, as [`execute`](Self::execute), and says who
    /// decided it: the store, or a local memory standing in for a store
    /// that failed ([`Fallback`](super::Fallback)). The guards claim through
    /// this, so a response can say it was admitted by the local memory
    /// ([`DecidedLocally`](crate::degrade::DecidedLocally)). The default is
    /// the store's own answer; a wrapper that may hold a `Fallback` must
    /// pass it on (one that did not would make every local decision look like
    /// the store's).
    fn execute_decided(
        &self,
        op: KeyOp<'_>,
    ) -> impl Future<Output = Result<(KeyReply, DecidedBy), StoreError>> + Send {
        async move { Ok((self.execute(op).await?, DecidedBy::Store)) }
    }
}

/// Who decided a store operation (see [`KeyValueStore::execute_decided`]).
///
/// ```
/// use norepeat::store::{DecidedBy, Fallback, KeyOp, KeyValueStore, MemoryStore, Resilient};
/// use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// // A primary whose breaker is open: every call fails at once.
/// let primary = Resilient::new(MemoryStore::default()).breaker(1, Duration::from_secs(60));
/// primary.circuit().record(false);
/// let store = Fallback::new(primary, MemoryStore::default());
/// let op = KeyOp::PutIfAbsent { key: "k", value: b"v", ttl: Duration::from_secs(5) };
/// let (_, by) = store.execute_decided(op).await.unwrap();
/// assert_eq!(by, DecidedBy::LocalMemory);
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecidedBy {
    /// The store answered.
    Store,
    /// The store failed, and a local memory answered in its place.
    LocalMemory,
}

/// Where a store reports the latency of answers that came after their
/// callers had given up (see [`KeyValueStore::report_late_answers`]). It
/// holds its target weakly: once the target is gone, reports go nowhere.
///
/// ```
/// use norepeat::store::LateAnswers;
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::time::Duration;
/// let seen = Arc::new(AtomicU64::new(0));
/// let counted = Arc::clone(&seen);
/// let target: Arc<dyn Fn(Duration) + Send + Sync> =
///     Arc::new(move |d: Duration| { counted.fetch_add(d.as_millis() as u64, Ordering::Relaxed); });
/// let late = LateAnswers::new(&target);
/// assert!(late.report(Duration::from_millis(7)));
/// drop(target);
/// assert!(!late.report(Duration::from_millis(7)), "its target is gone");
/// assert_eq!(seen.load(Ordering::Relaxed), 7);
/// ```
#[derive(Clone)]
pub struct LateAnswers(std::sync::Weak<dyn Fn(Duration) + Send + Sync>);

impl LateAnswers {
    /// Reports to `target` for as long as it lives.
    #[must_use]
    pub fn new(target: &std::sync::Arc<dyn Fn(Duration) + Send + Sync>) -> Self {
        Self(std::sync::Arc::downgrade(target))
    }

    /// Whether its target still lives.
    #[must_use]
    pub fn is_live(&self) -> bool {
        self.0.strong_count() > 0
    }

    /// Reports one late answer that took `took`; `false` when the target
    /// is gone (the reporter may then forget this `LateAnswers`).
    pub fn report(&self, took: Duration) -> bool {
        match self.0.upgrade() {
            Some(target) => {
                target(took);
                true
            }
            None => false,
        }
    }
}

impl std::fmt::Debug for LateAnswers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LateAnswers")
            .field("alive", &(self.0.strong_count() > 0))
            .finish()
    }
}

impl<S: KeyValueStore> KeyValueStore for std::sync::Arc<S> {
    fn execute(&self, op: KeyOp<'_>) -> impl Future<Output = Result<KeyReply, StoreError>> + Send {
        (**self).execute(op)
    }
    fn kind(&self) -> &'static str {
        (**self).kind()
    }
    fn reconnect(&self) {
        (**self).reconnect();
    }
    fn report_late_answers(&self, to: LateAnswers) {
        (**self).report_late_answers(to);
    }
    fn execute_decided(
        &self,
        op: KeyOp<'_>,
    ) -> impl Future<Output = Result<(KeyReply, DecidedBy), StoreError>> + Send {
        (**self).execute_decided(op)
    }
}

fn unexpected(op: &'static str, reply: &KeyReply) -> StoreError {
    StoreError::Protocol(format!("{op} answered {reply:?}"))
}

/// The typed calls of a [`KeyValueStore`], one per [`KeyOp`]. Implemented
/// for every key-value store.
pub trait KeyValueStoreExt: KeyValueStore {
    /// Stores `value` under `key` for `ttl` if the key is absent or expired
    /// (`SET key value NX PX ttl GET`).
    ///
    /// Returns `None` when the value was stored, or the value already there
    /// (unchanged) when it was not.
    fn put_if_absent(
        &self,
        key: &str,
        value: &[u8],
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Bytes>, StoreError>> + Send {
        async move {
            match self.execute(KeyOp::PutIfAbsent { key, value, ttl }).await? {
                KeyReply::Held(held) => Ok(held),
                other => Err(unexpected("put_if_absent", &other)),
            }
        }
    }

    /// Deletes `key` only if it still holds `expected`. Returns whether it did.
    fn delete_if_equals(
        &self,
        key: &str,
        expected: &[u8],
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        async move { changed(self.execute(KeyOp::DeleteIfEquals { key, expected })).await }
    }

    /// Sets a new time to live on `key` only if it still holds `expected`.
    /// Returns whether it did.
    fn expire_if_equals(
        &self,
        key: &str,
        expected: &[u8],
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        async move { changed(self.execute(KeyOp::ExpireIfEquals { key, expected, ttl })).await }
    }

    /// Replaces the value of `key` with `value` (and a new `ttl`) only if it
    /// still holds `expected`. Returns whether it did.
    fn replace_if_equals(
        &self,
        key: &str,
        expected: &[u8],
        value: &[u8],
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        async move {
            let op = KeyOp::ReplaceIfEquals {
                key,
                expected,
                value,
                ttl,
            };
            changed(self.execute(op)).await
        }
    }
}

impl<S: KeyValueStore + ?Sized> KeyValueStoreExt for S {}

/// Reads without deciding: [`KeyOp::Get`]. Apart from [`KeyValueStoreExt`],
/// whose calls are the guards' atomic decisions, so that a guard is never
/// written as a read followed by a write.
///
/// ```
/// use norepeat::store::{KeyValueStoreExt, MemoryStore, ReadStoreExt};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), norepeat::store::StoreError> {
/// let store = MemoryStore::default();
/// assert_eq!(store.get("order-7").await?, None);
/// store.put_if_absent("order-7", b"a", std::time::Duration::from_secs(30)).await?;
/// assert_eq!(store.get("order-7").await?.as_deref(), Some(&b"a"[..]));
/// # Ok(()) }
/// ```
pub trait ReadStoreExt: KeyValueStore {
    /// The value of `key`, or `None` when it is absent or expired.
    fn get(&self, key: &str) -> impl Future<Output = Result<Option<Bytes>, StoreError>> + Send {
        async move {
            match self.execute(KeyOp::Get { key }).await? {
                KeyReply::Held(held) => Ok(held),
                other => Err(unexpected("get", &other)),
            }
        }
    }
}

impl<S: KeyValueStore + ?Sized> ReadStoreExt for S {}

/// [`KeyValueStoreExt::put_if_absent`], saying who decided it: what the
/// guards claim with.
pub(crate) async fn put_if_absent_decided<S: KeyValueStore + ?Sized>(
    store: &S,
    key: &str,
    value: &[u8],
    ttl: Duration,
) -> Result<(Option<Bytes>, DecidedBy), StoreError> {
    match store
        .execute_decided(KeyOp::PutIfAbsent { key, value, ttl })
        .await?
    {
        (KeyReply::Held(held), by) => Ok((held, by)),
        (other, _) => Err(unexpected("put_if_absent", &other)),
    }
}

/// [`KeyValueStoreExt::replace_if_equals`], saying who decided it: what a
/// claim is taken over with.
pub(crate) async fn replace_if_equals_decided<S: KeyValueStore + ?Sized>(
    store: &S,
    key: &str,
    expected: &[u8],
    value: &[u8],
    ttl: Duration,
) -> Result<(bool, DecidedBy), StoreError> {
    let op = KeyOp::ReplaceIfEquals {
        key,
        expected,
        value,
        ttl,
    };
    match store.execute_decided(op).await? {
        (KeyReply::Changed(done), by) => Ok((done, by)),
        (other, _) => Err(unexpected("replace_if_equals", &other)),
    }
}

async fn changed(
    reply: impl Future<Output = Result<KeyReply, StoreError>>,
) -> Result<bool, StoreError> {
    match reply.await? {
        KeyReply::Changed(done) => Ok(done),
        other => Err(unexpected("a conditional operation", &other)),
    }
}
