//! `order.paid` events: an outbox in the database, a queue, consumers that
//! award points once per order.
//!
//! The outbox row is written in the same transaction that marks the order
//! PAID, so no event is lost. A publisher in each instance moves outbox rows
//! to the queue and marks them published:
//!
//! - with `NATS_URL`, to NATS JetStream: stream `NOREPEAT_EVENTS`, subject
//!   `order.paid`, header `Nats-Msg-Id` = the order id (the message id). Every
//!   instance pulls from one durable consumer (`norepeat-points`) with
//!   explicit acks, so each delivery goes to one of them and a delivery that
//!   is not acknowledged is delivered again (to any of them);
//! - otherwise, to an in-process queue of this instance.
//!
//! `NOREPEAT_DUPLICATE_EVENTS=N` publishes every event N times. On NATS only
//! the first copy carries `Nats-Msg-Id`: JetStream's own de-duplication window
//! would otherwise drop the copies, and the point is to show the consumer's.
//!
//! The consumer awards the points through [`Points::award`], guarded by
//! `#[norepeat::guard(mode = once, key = "{ev.order_id}")]` (the stored
//! result answers every later delivery of the order without touching the
//! database), with the ledger's unique key per order behind it (which holds
//! alone when the guard store fails open). A delivery is acknowledged only
//! after its effect is committed. When processing fails the guard releases
//! its claim and the delivery is not acknowledged (a NAK on NATS, a requeue
//! after 200 ms in process), so it is processed again, never dropped.
//!
//! Environment read here (beyond the documented `NATS_URL` and
//! `NOREPEAT_DUPLICATE_EVENTS`):
//! - `NOREPEAT_NATS_STREAM`: the stream name (default `NOREPEAT_EVENTS`).
//!   Any other name uses subject `<name>.order.paid`, so tests can run side by
//!   side on one NATS server.
//! - `NOREPEAT_NATS_ACK_WAIT_MS`: how long an unacknowledged delivery waits
//!   before JetStream delivers it again (default 30000).
//! - `NOREPEAT_FAIL_FIRST_EVENT` (**test hook**, never set in production):
//!   makes the first event this process handles fail once. `1` or `before`:
//!   the guarded function fails before the effect (the claim is released,
//!   the delivery NAKed). `after`: the effect is committed and stored, then
//!   the consumer "crashes" before acknowledging (no ack, no NAK), so the
//!   redelivery must be recognised as done.

use crate::config::ShopConfig;
use crate::db::{Db, OutboxEvent};
use async_nats::jetstream;
use async_nats::jetstream::AckKind;
use async_nats::jetstream::consumer::PullConsumer;
use futures_util::StreamExt as _;
use norepeat::attribute::Rejected;
use norepeat::store::{AnyStore, MemoryStore};
use norepeat::store::{Fallback, Resilient};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, mpsc};

/// The default JetStream stream.
pub const DEFAULT_STREAM: &str = "NOREPEAT_EVENTS";
/// The subject of the default stream.
pub const SUBJECT: &str = "order.paid";
/// The durable pull consumer every instance shares.
pub const DURABLE: &str = "norepeat-points";
/// How long a failed delivery waits before it is delivered again.
const RETRY_DELAY: Duration = Duration::from_millis(200);

/// The subject events go to on the stream `stream`.
#[must_use]
pub fn subject_for(stream: &str) -> String {
    if stream == DEFAULT_STREAM {
        SUBJECT.to_owned()
    } else {
        format!("{stream}.{SUBJECT}")
    }
}

/// An `order.paid` event as it travels on the queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OrderPaid {
    /// The order (and message) id.
    pub order_id: String,
    /// The buyer who earns the points.
    pub user_id: String,
    /// Points to award: 10 per unit ordered.
    pub points: i64,
}

impl From<&OutboxEvent> for OrderPaid {
    fn from(ev: &OutboxEvent) -> Self {
        Self {
            order_id: ev.event_id.clone(),
            user_id: ev.user_id.clone(),
            points: ev.points,
        }
    }
}

/// Why an event was not processed; the delivery is not acknowledged.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// The guard refused (another delivery of the order is in progress).
    #[error("guard: {0}")]
    Refused(#[from] Rejected),
    /// The database failed.
    #[error("database: {0}")]
    Db(String),
    /// `NOREPEAT_FAIL_FIRST_EVENT` (test hook) failed this attempt.
    #[error("injected failure (NOREPEAT_FAIL_FIRST_EVENT={0})")]
    Injected(&'static str),
}

/// The test hook of `NOREPEAT_FAIL_FIRST_EVENT`.
#[derive(Debug)]
enum FailHook {
    Off,
    Before(AtomicBool),
    After(AtomicBool),
}

impl FailHook {
    fn from_env() -> Self {
        match std::env::var("NOREPEAT_FAIL_FIRST_EVENT").as_deref() {
            Ok("1" | "before") => FailHook::Before(AtomicBool::new(true)),
            Ok("after") => FailHook::After(AtomicBool::new(true)),
            _ => FailHook::Off,
        }
    }
    fn before(&self) -> bool {
        matches!(self, FailHook::Before(armed) if armed.swap(false, Ordering::SeqCst))
    }
    fn after(&self) -> bool {
        matches!(self, FailHook::After(armed) if armed.swap(false, Ordering::SeqCst))
    }
}

/// The store of the points guard: the configured store with a time budget,
/// and a local fallback while it fails.
pub type PointsStore = Fallback<Resilient<AnyStore>>;

/// Awards the points of paid orders, once per order.
#[derive(Debug)]
pub struct Points {
    db: Db,
    store: PointsStore,
    hook: FailHook,
}

impl Points {
    /// Points awarded through `db`, guarded by `store`.
    #[must_use]
    pub fn new(db: Db, store: AnyStore, budget: Duration) -> Self {
        Self {
            db,
            store: Fallback::new(
                Resilient::new(store).timeout(budget),
                MemoryStore::default(),
            ),
            hook: FailHook::from_env(),
        }
    }

    /// Awards the event's points: at most once per order with success (the
    /// guard's stored result answers repeats; the ledger's unique key holds
    /// when the store cannot). Returns whether this order's points were
    /// written by the run that succeeded.
    ///
    /// # Errors
    /// The database failed (the claim is released, so a redelivery runs
    /// again), or another delivery of the order is being processed.
    #[norepeat::guard(
        store = self.store,
        key = "{ev.order_id}",
        mode = once,
        scope = "shop.order-paid.points",
        retention = "7d",
        lease = "10s",
        on_store_failure = fail_open
    )]
    pub async fn award(&self, ev: &OrderPaid) -> Result<bool, EventError> {
        if self.hook.before() {
            return Err(EventError::Injected("before"));
        }
        self.db
            .award_points(&ev.user_id, &ev.order_id, ev.points)
            .await
            .map_err(|e| EventError::Db(e.to_string()))
    }

    /// Processes one delivery. `Ok` means the effect is committed and the
    /// delivery may be acknowledged; `Err`, that it must be delivered again.
    ///
    /// # Errors
    /// See [`award`](Self::award); and the `after` test hook.
    pub async fn handle(&self, ev: &OrderPaid) -> Result<bool, EventError> {
        let awarded = self.award(ev).await?;
        if self.hook.after() {
            return Err(EventError::Injected("after"));
        }
        Ok(awarded)
    }
}

/// A handle on the instance's event machinery.
#[derive(Clone)]
pub struct Events {
    kick: Arc<Notify>,
}

/// Wakes the publisher (an order just became PAID).
pub fn kick(events: &Events) {
    events.kick.notify_one();
}

impl Events {
    /// Starts the publisher and the consumer of this instance: on NATS
    /// JetStream when `cfg.nats_url` is set, in process otherwise. `store` is
    /// the guard store the points consumer's `#[guard]` uses.
    ///
    /// # Errors
    /// When the queue cannot be reached.
    pub async fn start(cfg: &ShopConfig, db: Db, store: AnyStore) -> Result<Self, String> {
        let points = Arc::new(Points::new(db.clone(), store, cfg.store_timeout()));
        let kick = Arc::new(Notify::new());
        let copies = cfg.duplicate_events.max(1);
        match &cfg.nats_url {
            Some(url) => start_nats(url, db, points, Arc::clone(&kick), copies).await?,
            None => {
                let (tx, rx) = mpsc::channel::<OrderPaid>(10_000);
                tokio::spawn(publish_local(db, tx.clone(), Arc::clone(&kick), copies));
                tokio::spawn(consume_local(points, tx, rx));
            }
        }
        Ok(Self { kick })
    }

    /// A handle that publishes nothing (for tests that build the app by hand).
    #[must_use]
    pub fn disabled() -> Self {
        Self {
            kick: Arc::new(Notify::new()),
        }
    }
}

/// Waits for a kick (or half a second) and reads the unpublished events.
async fn next_pending(db: &Db, kick: &Notify) -> Vec<OutboxEvent> {
    let _ = tokio::time::timeout(Duration::from_millis(500), kick.notified()).await;
    match db.pending_events(100).await {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "outbox read failed; retrying");
            Vec::new()
        }
    }
}

fn record(outcome: &Result<bool, EventError>) {
    let outcome = match outcome {
        Ok(true) => "awarded",
        Ok(false) => "duplicate",
        Err(_) => "failed",
    };
    metrics::counter!("shop_events_consumed_total", "outcome" => outcome).increment(1);
}

// In process.

async fn publish_local(db: Db, tx: mpsc::Sender<OrderPaid>, kick: Arc<Notify>, copies: u32) {
    loop {
        for ev in next_pending(&db, &kick).await {
            let msg = OrderPaid::from(&ev);
            for _ in 0..copies {
                if tx.send(msg.clone()).await.is_err() {
                    return;
                }
            }
            if let Err(e) = db.mark_event_published(&ev.event_id).await {
                tracing::warn!(error = %e, "could not mark event published; it will be published again");
            }
        }
    }
}

async fn consume_local(
    points: Arc<Points>,
    tx: mpsc::Sender<OrderPaid>,
    mut rx: mpsc::Receiver<OrderPaid>,
) {
    while let Some(ev) = rx.recv().await {
        let outcome = points.handle(&ev).await;
        record(&outcome);
        if let Err(e) = outcome {
            // Not acknowledged: back on the queue after a pause.
            tracing::warn!(error = %e, order = %ev.order_id, "event processing failed; redelivering");
            let tx = tx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(RETRY_DELAY).await;
                let _ = tx.send(ev).await;
            });
        }
    }
}

// NATS JetStream.

async fn start_nats(
    url: &str,
    db: Db,
    points: Arc<Points>,
    kick: Arc<Notify>,
    copies: u32,
) -> Result<(), String> {
    let stream_name =
        std::env::var("NOREPEAT_NATS_STREAM").unwrap_or_else(|_| DEFAULT_STREAM.to_owned());
    let ack_wait = std::env::var("NOREPEAT_NATS_ACK_WAIT_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(Duration::from_secs(30), |ms| {
            Duration::from_millis(ms.max(100))
        });
    let subject = subject_for(&stream_name);
    let client = async_nats::connect(url)
        .await
        .map_err(|e| format!("NATS at {url}: {e}"))?;
    let js = jetstream::new(client);
    // Instances starting together race to create the stream and the
    // consumer; creating either with the same configuration is idempotent,
    // but a lost race can still answer an error once.
    let mut attempt = 0;
    let consumer: PullConsumer = loop {
        attempt += 1;
        match setup(&js, &stream_name, &subject, ack_wait).await {
            Ok(c) => break c,
            Err(e) if attempt < 5 => {
                tracing::warn!(error = %e, "JetStream setup failed; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e),
        }
    };
    tokio::spawn(publish_nats(js, subject, db, kick, copies));
    tokio::spawn(consume_nats(consumer, points));
    Ok(())
}

async fn setup(
    js: &jetstream::Context,
    stream: &str,
    subject: &str,
    ack_wait: Duration,
) -> Result<PullConsumer, String> {
    let stream = js
        .get_or_create_stream(jetstream::stream::Config {
            name: stream.to_owned(),
            subjects: vec![subject.to_owned()],
            max_age: Duration::from_secs(7 * 24 * 3600),
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("JetStream stream {stream}: {e}"))?;
    stream
        .get_or_create_consumer(
            DURABLE,
            jetstream::consumer::pull::Config {
                durable_name: Some(DURABLE.to_owned()),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait,
                max_deliver: -1,
                filter_subject: subject.to_owned(),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| format!("JetStream consumer {DURABLE}: {e}"))
}

async fn publish_nats(
    js: jetstream::Context,
    subject: String,
    db: Db,
    kick: Arc<Notify>,
    copies: u32,
) {
    loop {
        for ev in next_pending(&db, &kick).await {
            let payload = match serde_json::to_vec(&OrderPaid::from(&ev)) {
                Ok(p) => bytes::Bytes::from(p),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot encode an event");
                    continue;
                }
            };
            let mut sent = true;
            for copy in 0..copies {
                let mut headers = async_nats::HeaderMap::new();
                if copy == 0 {
                    headers.insert("Nats-Msg-Id", ev.event_id.as_str());
                }
                let acked = match js
                    .publish_with_headers(subject.clone(), headers, payload.clone())
                    .await
                {
                    Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                if let Err(e) = acked {
                    tracing::warn!(error = %e, order = %ev.event_id, "publish failed; the event stays in the outbox");
                    sent = false;
                    break;
                }
            }
            if sent && let Err(e) = db.mark_event_published(&ev.event_id).await {
                tracing::warn!(error = %e, "could not mark event published; it will be published again");
            }
        }
    }
}

async fn consume_nats(consumer: PullConsumer, points: Arc<Points>) {
    loop {
        let mut messages = match consumer.messages().await {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "cannot pull from JetStream; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        while let Some(next) = messages.next().await {
            let msg = match next {
                Ok(m) => m,
                Err(e) => {
                    tracing::debug!(error = %e, "JetStream pull error");
                    continue;
                }
            };
            let ev: OrderPaid = match serde_json::from_slice(&msg.payload) {
                Ok(ev) => ev,
                Err(e) => {
                    tracing::warn!(error = %e, "undecodable event; terminating it");
                    let _ = msg.ack_with(AckKind::Term).await;
                    continue;
                }
            };
            let outcome = points.handle(&ev).await;
            record(&outcome);
            let acked = match &outcome {
                // The effect is committed: only now acknowledge.
                Ok(_) => msg.ack().await,
                // As if the process died before acknowledging: JetStream
                // delivers again after the ack wait.
                Err(EventError::Injected("after")) => {
                    tracing::warn!(order = %ev.order_id, "test hook: not acknowledging a processed event");
                    Ok(())
                }
                Err(e) => {
                    tracing::warn!(error = %e, order = %ev.order_id, "event processing failed; redelivering");
                    msg.ack_with(AckKind::Nak(Some(RETRY_DELAY))).await
                }
            };
            if let Err(e) = acked {
                // A lost ack only means one more delivery, which the guard
                // answers from its stored result.
                tracing::warn!(error = %e, order = %ev.order_id, "could not acknowledge an event");
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
