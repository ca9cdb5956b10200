// Over 400 lines on purpose: the queue, its ticket and the send path (with the replicas' WAIT) share one batch's state and read best in order.
//! Auto-pipelining: the commands (claims, scripts) that arrive together
//! leave in one write.
//!
//! A multiplexed connection writes each command as soon as its task is
//! polled; at tens of thousands of requests a second few commands share a
//! write, and each costs the client a `write` and a `read` and Redis a
//! `read` and a `write` of their own (Redis spends about four times the
//! CPU on an unpipelined command as on a pipelined one, by the calibration
//! BENCHMARKS.md cites for a 2-core machine; the bench measures only the
//! pipelined ceiling). On a small machine, where Redis shares the cores
//! with the service, that is most of what a guarded request pays.
//!
//! So each connection has a [`Queue`]. A call puts its command there, and
//! the call that finds no task due to take the queue spawns one that yields
//! once (the tasks already ready on the runtime run first, and add theirs),
//! takes everything queued and sends it as one pipeline. Every command is
//! still its own atomic command: a pipeline is not a transaction, and one
//! command's error is that command's answer alone.
//! (`tests/it/redis_batching.rs` counts the writes that leave: 96 claims made
//! within one turn of the runtime leave in 2, one pipeline per connection;
//! without the queue, in 96.)
//!
//! The queue never stalls: a task dropped before it took the queue (its
//! runtime shut down first) gives its [`Ticket`] back, failing the commands
//! queued for it (none was sent), and the next call spawns another.
//!
//! On a connection that is up, batches reach it in the order they were
//! taken, so with each key on one connection the commands on a key leave
//! in the order they were called. While a connection is being made (at
//! first use, after a failure or a [`reconnect`]), a batch's first poll
//! waits for it, and two batches that wait may leave in either order:
//! every pair of commands the guards send on one key is owner-checked (a
//! renewal and a release, a completion and a renewal), so their order does
//! not change what a guard decides.
//!
//! [`reconnect`]: super::Connections::reconnect
//!
//! A caller that gives up before its batch leaves takes its command out of
//! it (nothing is sent for it); one that gives up later is in the same
//! place as with a plain connection: the command may have run, and its key
//! expires with its TTL.
//!
//! On a cluster node a command may be answered with a redirection
//! (`MOVED`, `ASK`) or told the slot is in transition (`TRYAGAIN`,
//! `CLUSTERDOWN`): it did not run. Its caller gets the command back with
//! that answer ([`Pending::answer_or_redirect`]), to send it again alone
//! where it belongs; one Redis never answers so.

use super::url::Replicas;
use futures_util::FutureExt;
use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisResult, Value};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// The commands waiting for their connection's next write.
#[derive(Default)]
pub(super) struct Queue {
    state: Mutex<State>,
    /// Held from the moment a batch is taken until it is in the
    /// connection's hands (the first poll of its send), so two batches of
    /// one queue reach the connection in the order they were taken.
    handover: Mutex<()>,
    /// When the connection last answered (nanoseconds from [`base`]; 0
    /// before its first answer), so a connection idle long enough to have been closed by the
    /// server is asked first ([`IDLE_PROBE`]).
    answered_at: AtomicU64,
}

/// A connection idle this long is probed (one `PING`) before its next
/// batch: the server may have closed it meanwhile (a restart), and a
/// command on a closed connection fails without being written (a 503 to
/// the first requests after an idle spell). The probe's failure makes the
/// connection manager reconnect, and the batch then goes on the new
/// connection; under load no connection is idle this long, and no probe
/// is sent. The probe costs its batch a round trip: 10 s keeps it off a
/// slow store's busy connections (at 2 s, a store 300 ms away each way
/// had calls pass their budget after short pauses).
pub(super) const IDLE_PROBE: Duration = Duration::from_secs(10);

/// The process's clock origin for [`Queue::answered_at`].
fn base() -> Instant {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

#[derive(Default)]
struct State {
    waiting: Vec<Waiting>,
    /// A [`Ticket`] is out: a task will take what is queued.
    scheduled: bool,
}

/// One queued command and where its answer goes.
pub(super) struct Waiting {
    cmd: Cmd,
    reply: oneshot::Sender<Reply>,
    /// A write that must reach the store's replicas before its caller
    /// is answered (see [`send`]).
    durable: bool,
}

/// A command's answer, and the command itself when the answer says it did
/// not run there (see [`redirected`]).
struct Reply {
    answer: RedisResult<Value>,
    redirected: Option<Cmd>,
}

/// The answer of a queued command, once its batch has been answered.
pub(super) struct Pending(oneshot::Receiver<Reply>);

/// A command a cluster node did not run, and why: it belongs to another
/// node (`MOVED`, `ASK`) or its slot is in transition (`TRYAGAIN`,
/// `CLUSTERDOWN`).
pub(super) struct Redirected {
    pub(super) cmd: Cmd,
    pub(super) error: RedisError,
}

/// An answer that says the command did not run on the node that answered:
/// a redirection or a slot in transition. `MASTERDOWN` and `READONLY` are
/// not among them: the command reached the node it was meant for.
fn redirected(answer: &RedisResult<Value>) -> bool {
    matches!(
        answer.as_ref().err().and_then(RedisError::code),
        Some("MOVED" | "ASK" | "TRYAGAIN" | "CLUSTERDOWN")
    )
}

impl Queue {
    /// Notes that the connection answered now.
    fn answered(&self) {
        let ns = u64::try_from(base().elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        self.answered_at.store(ns, Ordering::Relaxed);
    }

    /// How long since the connection last answered; before its first
    /// answer, since the process's clock origin (a connection made early,
    /// and not used since, may be as stale as an idle one: it is probed
    /// once, which costs a fresh one a round trip).
    fn idle_for(&self) -> Option<Duration> {
        let since = Duration::from_nanos(self.answered_at.load(Ordering::Relaxed));
        base().elapsed().checked_sub(since)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `cmd` (`durable`: a write its replicas must have, when the
    /// store asks for them). `true` when no task is due to take the queue:
    /// the caller must then hand a [`Ticket`] to a task that runs [`flush`].
    pub(super) fn push(&self, cmd: Cmd, durable: bool) -> (Pending, bool) {
        let (reply, answer) = oneshot::channel();
        let mut state = self.state();
        state.waiting.push(Waiting {
            cmd,
            reply,
            durable,
        });
        let first = !std::mem::replace(&mut state.scheduled, true);
        (Pending(answer), first)
    }

    /// Everything queued, in the order it came, and whether the queue is
    /// held for its taker: with `hold_durable`, a batch that carries a
    /// durable write keeps the queue scheduled, so what comes meanwhile
    /// waits for that batch's `WAIT` and leaves with the next one (see
    /// [`flush`]). Otherwise the next push schedules the next batch.
    fn take(&self, hold_durable: bool) -> (Vec<Waiting>, bool) {
        let mut state = self.state();
        let batch = std::mem::take(&mut state.waiting);
        let held = hold_durable && batch.iter().any(|w| w.durable);
        state.scheduled = held;
        (batch, held)
    }
}

/// The duty to send a queue's next batch, held by the task that will.
/// Dropped before it took the queue (its task never ran: its runtime shut
/// down first), it gives the duty back, so that the next call schedules a
/// new task instead of queueing behind one that will never come, and the
/// commands queued for it fail at once (nothing was sent for them): a
/// caller on another runtime that queued behind it would otherwise wait
/// for a later call to take the queue.
pub(super) struct Ticket<P: AsRef<Queue>> {
    slot: P,
    taken: bool,
}

impl<P: AsRef<Queue>> Ticket<P> {
    /// The ticket of `slot`'s queue, after a [`Queue::push`] that answered
    /// `true`.
    pub(super) fn new(slot: P) -> Self {
        Self { slot, taken: false }
    }
}

impl<P: AsRef<Queue>> Drop for Ticket<P> {
    fn drop(&mut self) {
        if !self.taken {
            let stranded = {
                let mut state = self.slot.as_ref().state();
                state.scheduled = false;
                std::mem::take(&mut state.waiting)
            };
            // Their answers' senders go: each caller gets the error of a
            // dropped batch.
            drop(stranded);
        }
    }
}

impl Pending {
    /// The command's own answer: its value, its server error, or the error
    /// that failed its whole batch (a broken connection, a timeout).
    pub(super) fn answer(self) -> impl Future<Output = RedisResult<Value>> + Send {
        self.answer_or_redirect().map(|answer| match answer {
            Ok(answer) => answer,
            Err(Redirected { error, .. }) => Err(error),
        })
    }

    /// Like [`answer`](Self::answer), but a command the node did not run
    /// (a redirection, a slot in transition) comes back, to be sent again
    /// where it belongs. (Combinators, not an `async fn`: the future is
    /// the receiver alone, part of every claim's.)
    pub(super) fn answer_or_redirect(
        self,
    ) -> impl Future<Output = Result<RedisResult<Value>, Redirected>> + Send {
        self.0.map(|reply| match reply {
            Ok(Reply {
                answer: Err(error),
                redirected: Some(cmd),
            }) => Err(Redirected { cmd, error }),
            Ok(Reply { answer, .. }) => Ok(answer),
            Err(_) => Ok(Err(RedisError::from((
                ErrorKind::Io,
                "the batch carrying this command was dropped",
            )))),
        })
    }
}

/// Waits one turn of the runtime (the tasks already ready run first, and
/// queue their commands), then sends everything in the ticket's queue on
/// the connection `con` gives at that moment (a replaced connection is not
/// used).
///
/// An answer whose caller has gone (it gave up while the command was in
/// flight) is reported to `late` with the time it took from the write:
/// a slow store is then seen as slow, not as silent. A command never
/// answered (its batch failed: a broken connection, the response timeout)
/// reports nothing, nor does one answered with a server error.
///
/// With `replicas`, a batch that carries a durable write ends with one
/// `WAIT` (see [`send`]), and the queue stays this task's until that
/// `WAIT` is answered: what comes meanwhile leaves in one next batch,
/// under one `WAIT`, rather than each command in a batch of its own behind
/// it. (Redis runs nothing more of a connection whose client is blocked in
/// `WAIT`, so the commands held here lose no time. Sent as they came, each
/// batch of one or two claims paid a replication round trip of its own:
/// 1.2 claims per `WAIT` at 64 in flight, and a sixth of the claims per
/// second of `replicas=0`; see the bench's `fingerprint.acquire.replicas1`.)
pub(super) async fn flush<P, C>(
    mut ticket: Ticket<P>,
    con: impl Fn(&P) -> C,
    late: impl Fn(&P, Duration),
    replicas: Option<Replicas>,
) where
    P: AsRef<Queue>,
    C: ConnectionLike + Send,
{
    loop {
        tokio::task::yield_now().await;
        // Due to take the queue again: a task dropped before it does gives
        // the duty back (see [`Ticket`]).
        ticket.taken = false;
        let mut con = con(&ticket.slot);
        let slot = &ticket.slot;
        let queue = slot.as_ref();
        // Before the queue is taken: nothing of it is sent on a connection
        // that may be closed (see IDLE_PROBE). The ticket is held meanwhile,
        // so the commands that come wait in the queue, in order.
        if queue.idle_for().is_some_and(|idle| idle >= IDLE_PROBE) {
            let probe = redis::cmd("PING").query_async::<Value>(&mut con).await;
            if probe.is_ok() {
                queue.answered();
            }
        }
        let mut sending = std::pin::pin!(async {
            let (batch, held) = queue.take(replicas.is_some());
            if send(&mut con, batch, |took| late(slot, took), replicas).await {
                queue.answered();
            }
            held
        });
        // The take and the first poll (which writes the batch into the
        // connection's channel) under the handover lock: a batch taken later
        // (a release after a completion, on the same key) cannot reach the
        // connection first.
        let polled = std::future::poll_fn(|cx| {
            let _handover = queue
                .handover
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            Poll::Ready(sending.as_mut().poll(cx))
        })
        .await;
        ticket.taken = true;
        let held = match polled {
            Poll::Ready(held) => held,
            Poll::Pending => sending.await,
        };
        if !held {
            return;
        }
    }
}

/// Sends `batch` on `con`, one write, and hands each command its answer.
/// Commands whose caller has gone are left out. Whether the connection
/// answered (a server error is an answer; a broken connection is not).
///
/// With `replicas`, a batch that carries a durable write (a claim, a
/// completion) ends with `WAIT count timeout`, in the same pipeline: one
/// round trip, and one `WAIT` covers every write before it on the
/// connection. A durable write is answered only after it; when fewer
/// replicas than asked have it, its caller gets an error (the write ran on
/// the master, but a failover before the replicas copy it would lose it:
/// a store failure, for the route's policy to decide).
async fn send<C: ConnectionLike + Send>(
    con: &mut C,
    mut batch: Vec<Waiting>,
    late: impl Fn(Duration),
    replicas: Option<Replicas>,
) -> bool {
    batch.retain(|w| !w.reply.is_closed());
    let replicas = replicas.filter(|_| batch.iter().any(|w| w.durable));
    let sent = Instant::now();
    // An answer its caller no longer waits for: the store answered, late.
    // Only a value is reported: a server error (an `OOM`, a redirection) is
    // no sign that the store works, and a late one must not close a
    // breaker. A redirected command is handed back (cloned: only on a
    // cluster, only while slots move).
    let answer = |reply: oneshot::Sender<Reply>, value: RedisResult<Value>, cmd: &Cmd| {
        let redirected = redirected(&value).then(|| cmd.clone());
        let worked = value.is_ok();
        let reply = reply.send(Reply {
            answer: value,
            redirected,
        });
        if reply.is_err() && worked {
            late(sent.elapsed());
        }
    };
    // No answer: the connection failed or timed out.
    let failed = |reply: oneshot::Sender<Reply>, e: RedisError| {
        let _ = reply.send(Reply {
            answer: Err(e),
            redirected: None,
        });
    };
    match batch.len() {
        0 => false,
        1 if replicas.is_none() => {
            let Waiting { cmd, reply, .. } = batch.pop().expect("one command");
            match cmd.query_async::<Value>(con).await {
                // A server error (a redirection among them) is the command's
                // own answer.
                Err(e) if e.code().is_some() => {
                    answer(reply, Err(e), &cmd);
                    true
                }
                Err(e) => {
                    failed(reply, e);
                    false
                }
                Ok(value) => {
                    answer(reply, value.extract_error(), &cmd);
                    true
                }
            }
        }
        n => {
            let mut pipe = Pipeline::with_capacity(n + 1);
            // With `ignore_errors`, a command's server error is its own
            // answer (a `Value::ServerError`), not the pipeline's.
            pipe.ignore_errors();
            let mut replies = Vec::with_capacity(n);
            let mut durable = Vec::with_capacity(n);
            for Waiting {
                cmd,
                reply,
                durable: d,
            } in batch
            {
                pipe.add_command(cmd);
                replies.push(reply);
                durable.push(d);
            }
            if let Some(r) = replicas {
                pipe.add_command(wait(r));
            }
            let expected = n + usize::from(replicas.is_some());
            let answers = pipe.query_async::<Vec<Value>>(con).await.and_then(|v| {
                if v.len() == expected {
                    Ok(v)
                } else {
                    Err(RedisError::from((
                        ErrorKind::Parse,
                        "a pipeline's answers did not match its commands",
                        format!("{} answers to {expected} commands", v.len()),
                    )))
                }
            });
            match answers {
                Ok(mut values) => {
                    let shortfall = replicas.and_then(|r| {
                        let acked = values.pop().map(Value::extract_error);
                        short_of(r, acked)
                    });
                    for (((value, reply), cmd), durable) in values
                        .into_iter()
                        .zip(replies)
                        .zip(pipe.cmd_iter())
                        .zip(durable)
                    {
                        let value = match (&shortfall, value.extract_error()) {
                            (Some(e), Ok(v)) if durable && wrote(&v) => Err(e.clone()),
                            (_, value) => value,
                        };
                        answer(reply, value, cmd);
                    }
                    true
                }
                Err(e) => {
                    for reply in replies {
                        failed(reply, e.clone());
                    }
                    false
                }
            }
        }
    }
}

/// `WAIT count timeout_ms`.
pub(super) fn wait(r: Replicas) -> Cmd {
    let mut cmd = Cmd::with_capacity(3, 24);
    cmd.arg("WAIT")
        .arg(r.count)
        .arg(u64::try_from(r.timeout.as_millis()).unwrap_or(u64::MAX));
    cmd
}

/// Whether a durable command's answer says it wrote: a claim's
/// `SET NX GET` answers nil when it took the key (the value held when it
/// did not), an owner-checked replacement's script 1 when it replaced (0
/// when the key held another value). One that wrote nothing needs no
/// replica's acknowledgement: its answer stands whatever `WAIT` said (a
/// claim refused as a repeat stays a repeat, not a store failure).
pub(super) fn wrote(answer: &Value) -> bool {
    matches!(answer, Value::Nil | Value::Int(1))
}

/// The code of the error a durable write gets when fewer replicas than
/// asked acknowledged it; `map_err` makes it a
/// [`StoreError::NotReplicated`](crate::store::StoreError::NotReplicated).
pub(super) const NOT_REPLICATED: &str = "NOREPEAT_NOT_REPLICATED";

/// The error of the durable writes of a batch whose `WAIT` answered
/// `acked`, or `None` when at least `r.count` replicas have them.
pub(super) fn short_of(r: Replicas, acked: Option<RedisResult<Value>>) -> Option<RedisError> {
    let got = match acked {
        Some(Ok(Value::Int(n))) if n >= i64::from(r.count) => return None,
        Some(Ok(Value::Int(n))) => format!("{n} had it"),
        Some(Ok(other)) => format!("WAIT answered {other:?}"),
        Some(Err(e)) => format!("WAIT failed: {e}"),
        None => "WAIT was not answered".to_owned(),
    };
    Some(redis::make_extension_error(
        NOT_REPLICATED.to_owned(),
        Some(format!(
            "written on the master, but not acknowledged by enough replicas \
             (a failover could lose it): asked {} within {} ms, {got}",
            r.count,
            r.timeout.as_millis()
        )),
    ))
}
