//! A switch that takes the guard store down, for the storm's outage scenario.
//!
//! While down, every call fails as a refused connection would, before
//! reaching the store: what an instance sees when Redis dies. It works the
//! same over the memory store and over a Redis the storm must not kill.

use norepeat::store::{
    KeyOp, KeyReply, KeyValueStore, LateAnswers, RateDecision, RateOp, RateStore, StoreError,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// `S`, unless the switch is down.
#[derive(Debug, Clone)]
pub struct Outage<S> {
    inner: S,
    down: Arc<AtomicBool>,
}

impl<S> Outage<S> {
    /// `inner`, up.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            down: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Takes the store down (`true`) or brings it back.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    fn check(&self) -> Result<(), StoreError> {
        if self.down.load(Ordering::Relaxed) {
            Err(StoreError::Connection("store down (outage switch)".into()))
        } else {
            Ok(())
        }
    }
}

impl<S: KeyValueStore> KeyValueStore for Outage<S> {
    async fn execute(&self, op: KeyOp<'_>) -> Result<KeyReply, StoreError> {
        self.check()?;
        self.inner.execute(op).await
    }
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn reconnect(&self) {
        self.inner.reconnect();
    }
    // Passed on, or the budget never learns that the store turned slow:
    // every late answer would be taken for silence.
    fn report_late_answers(&self, to: LateAnswers) {
        self.inner.report_late_answers(to);
    }
}

impl<S: RateStore> RateStore for Outage<S> {
    async fn rate(&self, op: RateOp<'_>) -> Result<RateDecision, StoreError> {
        self.check()?;
        self.inner.rate(op).await
    }
}
