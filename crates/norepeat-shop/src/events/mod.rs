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
//!
//! One file per concern: [`Events`] starts the machinery and wakes the
//! publisher (`queue`), the event as it travels (`message`), the guarded
//! consumer (`points`), the in-process queue (`local`), NATS JetStream
//! (`nats`) and the `NOREPEAT_FAIL_FIRST_EVENT` test hook (`hook`).

mod hook;
mod local;
mod message;
mod nats;
mod pending;
mod points;
mod queue;

pub use message::OrderPaid;
pub use nats::{DEFAULT_STREAM, DURABLE, SUBJECT, subject_for};
pub use points::{EventError, Points, PointsStore};
pub use queue::{Events, kick};
