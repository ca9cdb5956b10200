//! NATS JetStream: one stream, one durable pull consumer shared by every
//! instance, explicit acks (see the module docs of [`crate::events`]).

use super::OrderPaid;
use super::pending::{RETRY_DELAY, next_pending};
use super::points::{EventError, Points, record};
use crate::db::Db;
use async_nats::jetstream;
use async_nats::jetstream::AckKind;
use async_nats::jetstream::consumer::PullConsumer;
use futures_util::StreamExt as _;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// The default JetStream stream.
pub const DEFAULT_STREAM: &str = "NOREPEAT_EVENTS";
/// The subject of the default stream.
pub const SUBJECT: &str = "order.paid";
/// The durable pull consumer every instance shares.
pub const DURABLE: &str = "norepeat-points";
/// The subject events go to on the stream `stream`.
#[must_use]
pub fn subject_for(stream: &str) -> String {
    if stream == DEFAULT_STREAM {
        SUBJECT.to_owned()
    } else {
        format!("{stream}.{SUBJECT}")
    }
}

pub(super) async fn start(
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
