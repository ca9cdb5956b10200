//! The process-wide store of guarded functions that name no `store = ...`.

use super::Rejected;
use crate::store::{RateDecision, Store, StoreError};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use std::time::Duration;

/// The process-wide store of [`#[norepeat::guard]`](macro@crate::guard)
/// functions that name no `store = ...`: set once at start with
/// [`set_default_store`], read with [`default_store`].
///
/// It holds any [`Store`] behind an `Arc` (cloning it is cheap); each call
/// goes through one boxed future, a small price next to a store's round
/// trip. It is a [`Store`] itself, so [`Guarded`](super::Guarded) can use it without the
/// attribute.
#[derive(Clone)]
pub struct DefaultStore(std::sync::Arc<dyn ErasedStore>);

impl std::fmt::Debug for DefaultStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("DefaultStore").field(&self.0.kind()).finish()
    }
}

static DEFAULT_STORE: std::sync::OnceLock<DefaultStore> = std::sync::OnceLock::new();

/// [`set_default_store`] was called before: the process-wide store is set
/// once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the process-wide norepeat store is already set: set it once, at start")]
pub struct AlreadySet;

/// Sets the store used by every [`#[norepeat::guard]`](macro@crate::guard)
/// function that names no `store = ...`, for the life of the process. Call
/// it once, at start, before the first guarded call; until then such a call
/// returns `Err(E::from(`[`Rejected::NoDefaultStore`]`))` without running
/// its body.
///
/// A function with `store = ...` keeps using its own store. Wrap the store
/// first if it needs to survive outages
/// ([`Resilient`](crate::degrade::Resilient)).
///
/// # Errors
/// [`AlreadySet`] when a store was set before (the first one stays).
///
/// ```
/// use norepeat::attribute::Rejected;
/// use norepeat::store::MemoryStore;
///
/// #[derive(Debug)]
/// struct Failed;
/// impl From<Rejected> for Failed {
///     fn from(_: Rejected) -> Self { Failed }
/// }
///
/// // No `store = ...`: the process-wide store.
/// #[norepeat::guard(key = "{order_id}", mode = once)]
/// async fn ship(order_id: u64) -> Result<u64, Failed> {
///     Ok(order_id)
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), norepeat::attribute::AlreadySet> {
/// norepeat::attribute::set_default_store(MemoryStore::default())?;
/// assert_eq!(ship(7).await.unwrap(), 7);
/// # Ok(()) }
/// ```
pub fn set_default_store<S: Store>(store: S) -> Result<(), AlreadySet> {
    DEFAULT_STORE
        .set(DefaultStore(std::sync::Arc::new(store)))
        .map_err(|_| AlreadySet)
}

/// The process-wide store set by [`set_default_store`] (what a guarded
/// function without `store = ...` uses).
///
/// # Errors
/// [`Rejected::NoDefaultStore`] when none was set.
pub fn default_store() -> Result<DefaultStore, Rejected> {
    DEFAULT_STORE.get().cloned().ok_or(Rejected::NoDefaultStore)
}

/// [`Store`] as an object: each method returns a boxed future.
trait ErasedStore: Send + Sync + 'static {
    fn put_if_absent<'a>(
        &'a self,
        key: &'a str,
        value: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Option<Bytes>, StoreError>>;
    fn delete_if_equals<'a>(
        &'a self,
        key: &'a str,
        expected: &'a [u8],
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
    fn expire_if_equals<'a>(
        &'a self,
        key: &'a str,
        expected: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
    fn replace_if_equals<'a>(
        &'a self,
        key: &'a str,
        expected: &'a [u8],
        value: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
    fn fixed_window<'a>(
        &'a self,
        key: &'a str,
        limit: u64,
        window: Duration,
    ) -> BoxFuture<'a, Result<RateDecision, StoreError>>;
    fn sliding_window<'a>(
        &'a self,
        key: &'a str,
        limit: u64,
        window: Duration,
    ) -> BoxFuture<'a, Result<RateDecision, StoreError>>;
    fn gcra<'a>(
        &'a self,
        key: &'a str,
        emission: Duration,
        burst: u64,
    ) -> BoxFuture<'a, Result<RateDecision, StoreError>>;
    fn kind(&self) -> &'static str;
    fn reconnect(&self);
}

impl<S: Store> ErasedStore for S {
    fn put_if_absent<'a>(
        &'a self,
        key: &'a str,
        value: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Option<Bytes>, StoreError>> {
        Box::pin(Store::put_if_absent(self, key, value, ttl))
    }
    fn delete_if_equals<'a>(
        &'a self,
        key: &'a str,
        expected: &'a [u8],
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(Store::delete_if_equals(self, key, expected))
    }
    fn expire_if_equals<'a>(
        &'a self,
        key: &'a str,
        expected: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(Store::expire_if_equals(self, key, expected, ttl))
    }
    fn replace_if_equals<'a>(
        &'a self,
        key: &'a str,
        expected: &'a [u8],
        value: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(Store::replace_if_equals(self, key, expected, value, ttl))
    }
    fn fixed_window<'a>(
        &'a self,
        key: &'a str,
        limit: u64,
        window: Duration,
    ) -> BoxFuture<'a, Result<RateDecision, StoreError>> {
        Box::pin(Store::fixed_window(self, key, limit, window))
    }
    fn sliding_window<'a>(
        &'a self,
        key: &'a str,
        limit: u64,
        window: Duration,
    ) -> BoxFuture<'a, Result<RateDecision, StoreError>> {
        Box::pin(Store::sliding_window(self, key, limit, window))
    }
    fn gcra<'a>(
        &'a self,
        key: &'a str,
        emission: Duration,
        burst: u64,
    ) -> BoxFuture<'a, Result<RateDecision, StoreError>> {
        Box::pin(Store::gcra(self, key, emission, burst))
    }
    fn kind(&self) -> &'static str {
        Store::kind(self)
    }
    fn reconnect(&self) {
        Store::reconnect(self);
    }
}

impl Store for DefaultStore {
    async fn put_if_absent(
        &self,
        key: &str,
        value: &[u8],
        ttl: Duration,
    ) -> Result<Option<Bytes>, StoreError> {
        self.0.put_if_absent(key, value, ttl).await
    }
    async fn delete_if_equals(&self, key: &str, expected: &[u8]) -> Result<bool, StoreError> {
        self.0.delete_if_equals(key, expected).await
    }
    async fn expire_if_equals(
        &self,
        key: &str,
        expected: &[u8],
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.0.expire_if_equals(key, expected, ttl).await
    }
    async fn replace_if_equals(
        &self,
        key: &str,
        expected: &[u8],
        value: &[u8],
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.0.replace_if_equals(key, expected, value, ttl).await
    }
    async fn fixed_window(
        &self,
        key: &str,
        limit: u64,
        window: Duration,
    ) -> Result<RateDecision, StoreError> {
        self.0.fixed_window(key, limit, window).await
    }
    async fn sliding_window(
        &self,
        key: &str,
        limit: u64,
        window: Duration,
    ) -> Result<RateDecision, StoreError> {
        self.0.sliding_window(key, limit, window).await
    }
    async fn gcra(
        &self,
        key: &str,
        emission: Duration,
        burst: u64,
    ) -> Result<RateDecision, StoreError> {
        self.0.gcra(key, emission, burst).await
    }
    fn kind(&self) -> &'static str {
        self.0.kind()
    }
    fn reconnect(&self) {
        self.0.reconnect();
    }
}
