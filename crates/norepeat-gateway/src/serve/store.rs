//! The file's store, connected in the background when it is down at start:
//! the gateway starts and serves either way (a rollout must not wait on
//! Redis), and its routes follow their `on_store_failure` until the store
//! answers.

use norepeat::store::{
    AnyStore, KeyOp, KeyReply, KeyValueStore, LateAnswers, RateDecision, RateOp, RateStore,
    StoreError,
};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// The file's store, or the promise of it: every call fails with
/// [`StoreError::Connection`] until a connection is made (retried every
/// [`RETRY`] in a task of its own), then goes to the store.
#[derive(Debug, Clone)]
pub(super) struct Connecting {
    kind: &'static str,
    store: Arc<OnceLock<AnyStore>>,
    /// Where late answers are reported, passed on once connected (the
    /// budget asks for them once, at its start).
    late: Arc<Mutex<Option<LateAnswers>>>,
}

/// How often a store that was down at start is tried again.
pub(super) const RETRY: Duration = Duration::from_secs(1);

impl Connecting {
    /// A store that is there.
    pub(super) fn ready(store: AnyStore) -> Self {
        let kind = store.kind();
        Self {
            kind,
            store: Arc::new(OnceLock::from(store)),
            late: Arc::default(),
        }
    }

    /// Connects to `url` (`None`: memory). A store that cannot be reached
    /// is connected to in the background, and logged; a URL that is wrong
    /// is an error.
    pub(super) async fn connect(url: Option<&str>) -> Result<Self, StoreError> {
        match AnyStore::from_url(url).await {
            Ok(store) => Ok(Self::ready(store)),
            Err(e @ StoreError::InvalidUrl(_)) => Err(e),
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "the store does not answer: serving anyway, every route following its on_store_failure until it does (tried again every second)"
                );
                let pending = Self {
                    kind: match url {
                        Some(u) if u.starts_with("redis+cluster://") => "cluster",
                        _ => "redis",
                    },
                    store: Arc::new(OnceLock::new()),
                    late: Arc::default(),
                };
                let url = url.map(str::to_owned);
                let store = Arc::downgrade(&pending.store);
                let late = Arc::clone(&pending.late);
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(RETRY).await;
                        let Some(slot) = store.upgrade() else { return };
                        if let Ok(s) = AnyStore::from_url(url.as_deref()).await {
                            let _ = slot.set(s);
                            pass_late(&slot, &late);
                            tracing::info!("the store answers: connected");
                            return;
                        }
                    }
                });
                Ok(pending)
            }
        }
    }

    /// Whether the store is connected.
    pub(super) fn is_connected(&self) -> bool {
        self.store.get().is_some()
    }

    fn get(&self) -> Result<&AnyStore, StoreError> {
        self.store
            .get()
            .ok_or_else(|| StoreError::Connection("not connected yet".to_owned()))
    }
}

impl KeyValueStore for Connecting {
    async fn execute(&self, op: KeyOp<'_>) -> Result<KeyReply, StoreError> {
        self.get()?.execute(op).await
    }
    fn kind(&self) -> &'static str {
        self.kind
    }
    fn reconnect(&self) {
        if let Ok(s) = self.get() {
            s.reconnect();
        }
    }
    fn report_late_answers(&self, to: LateAnswers) {
        // Kept, then passed on if the store is there by now: whichever of
        // this and the connecting task takes it last passes it on.
        *self.late.lock().unwrap_or_else(|p| p.into_inner()) = Some(to);
        pass_late(&self.store, &self.late);
    }
}

/// Passes the kept late-answer target on to the store, once it is there.
fn pass_late(store: &OnceLock<AnyStore>, late: &Mutex<Option<LateAnswers>>) {
    if let Some(s) = store.get()
        && let Some(to) = late.lock().unwrap_or_else(|p| p.into_inner()).take()
    {
        s.report_late_answers(to);
    }
}

impl RateStore for Connecting {
    async fn rate(&self, op: RateOp<'_>) -> Result<RateDecision, StoreError> {
        self.get()?.rate(op).await
    }
}
