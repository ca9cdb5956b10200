//! The process-wide store of guarded functions that name no `store = ...`.

use super::Rejected;
use crate::store::{
    DecidedBy, KeyOp, KeyReply, KeyValueStore, LateAnswers, RateDecision, RateOp, RateStore, Store,
    StoreError,
};

use futures_util::future::BoxFuture;

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
/// ([`Resilient`](crate::store::Resilient)).
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

/// An answer and who decided it.
type Decided<T> = Result<(T, DecidedBy), StoreError>;

/// [`Store`] as an object: each method returns a boxed future.
trait ErasedStore: Send + Sync + 'static {
    fn execute<'a>(&'a self, op: KeyOp<'a>) -> BoxFuture<'a, Result<KeyReply, StoreError>>;
    fn rate<'a>(&'a self, op: RateOp<'a>) -> BoxFuture<'a, Result<RateDecision, StoreError>>;
    fn execute_decided<'a>(&'a self, op: KeyOp<'a>) -> BoxFuture<'a, Decided<KeyReply>>;
    fn rate_decided<'a>(&'a self, op: RateOp<'a>) -> BoxFuture<'a, Decided<RateDecision>>;
    fn kind(&self) -> &'static str;
    fn reconnect(&self);
    fn report_late_answers(&self, to: LateAnswers);
}

impl<S: Store> ErasedStore for S {
    fn execute<'a>(&'a self, op: KeyOp<'a>) -> BoxFuture<'a, Result<KeyReply, StoreError>> {
        Box::pin(KeyValueStore::execute(self, op))
    }
    fn rate<'a>(&'a self, op: RateOp<'a>) -> BoxFuture<'a, Result<RateDecision, StoreError>> {
        Box::pin(RateStore::rate(self, op))
    }
    fn execute_decided<'a>(&'a self, op: KeyOp<'a>) -> BoxFuture<'a, Decided<KeyReply>> {
        Box::pin(KeyValueStore::execute_decided(self, op))
    }
    fn rate_decided<'a>(&'a self, op: RateOp<'a>) -> BoxFuture<'a, Decided<RateDecision>> {
        Box::pin(RateStore::rate_decided(self, op))
    }
    fn kind(&self) -> &'static str {
        KeyValueStore::kind(self)
    }
    fn reconnect(&self) {
        KeyValueStore::reconnect(self);
    }
    fn report_late_answers(&self, to: LateAnswers) {
        KeyValueStore::report_late_answers(self, to);
    }
}

impl KeyValueStore for DefaultStore {
    async fn execute(&self, op: KeyOp<'_>) -> Result<KeyReply, StoreError> {
        self.0.execute(op).await
    }
    fn kind(&self) -> &'static str {
        self.0.kind()
    }
    fn reconnect(&self) {
        self.0.reconnect();
    }
    fn report_late_answers(&self, to: LateAnswers) {
        self.0.report_late_answers(to);
    }
    async fn execute_decided(&self, op: KeyOp<'_>) -> Decided<KeyReply> {
        self.0.execute_decided(op).await
    }
}

impl RateStore for DefaultStore {
    async fn rate(&self, op: RateOp<'_>) -> Result<RateDecision, StoreError> {
        self.0.rate(op).await
    }
    async fn rate_decided(&self, op: RateOp<'_>) -> Decided<RateDecision> {
        self.0.rate_decided(op).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    /// A store that reports one late answer of 7 ms to whoever asks.
    #[derive(Clone)]
    struct LateBy7;

    impl KeyValueStore for LateBy7 {
        async fn execute(&self, _: KeyOp<'_>) -> Result<KeyReply, StoreError> {
            Err(StoreError::Connection("never asked".into()))
        }
        fn kind(&self) -> &'static str {
            "late"
        }
        fn report_late_answers(&self, to: LateAnswers) {
            to.report(Duration::from_millis(7));
        }
    }

    impl RateStore for LateBy7 {
        async fn rate(&self, _: RateOp<'_>) -> Result<RateDecision, StoreError> {
            Err(StoreError::Connection("never asked".into()))
        }
    }

    /// The default store passes the wish for late answers on to the store
    /// it holds (before, it dropped it: a `Resilient` over it never learned
    /// that the store turned slow).
    #[test]
    fn late_answers_reach_the_store_inside() {
        let store = DefaultStore(Arc::new(LateBy7));
        let seen = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&seen);
        let target: Arc<dyn Fn(Duration) + Send + Sync> = Arc::new(move |d: Duration| {
            counted.fetch_add(u64::try_from(d.as_millis()).unwrap_or(0), Ordering::Relaxed);
        });
        KeyValueStore::report_late_answers(&store, LateAnswers::new(&target));
        assert_eq!(seen.load(Ordering::Relaxed), 7);
    }
}
