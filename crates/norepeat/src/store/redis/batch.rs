//! Auto-pipelining: the commands (claims, scripts) that arrive together
//! leave in one write.
//!
//! A multiplexed connection writes each command as soon as its task is
//! polled; at tens of thousands of requests a second few commands share a
//! write, and each costs the client a `write` and a `read` and Redis a
//! `read` and a `write` of their own (Redis spends about four times the CPU
//! on an unpipelined command as on a pipelined one). On a small machine,
//! where Redis shares the cores with the service, that is most of what a
//! guarded request pays.
//!
//! So each connection has a [`Queue`]. A call puts its command there, and
//! the call that finds the queue empty spawns a task that yields once (the
//! tasks already ready on the runtime run first, and add theirs), takes
//! everything queued and sends it as one pipeline. Every command is still
//! its own atomic command: a pipeline is not a transaction, and one
//! command's error is that command's answer alone.
//!
//! A caller that gives up before its batch leaves takes its command out of
//! it (nothing is sent for it); one that gives up later is in the same
//! place as with a plain connection: the command may have run, and its key
//! expires with its TTL.

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisResult, Value};
use std::sync::Mutex;
use tokio::sync::oneshot;

/// The commands waiting for their connection's next write.
#[derive(Default)]
pub(super) struct Queue {
    waiting: Mutex<Vec<Waiting>>,
}

/// One queued command and where its answer goes.
pub(super) struct Waiting {
    cmd: Cmd,
    reply: oneshot::Sender<RedisResult<Value>>,
}

/// The answer of a queued command, once its batch has been answered.
pub(super) struct Pending(oneshot::Receiver<RedisResult<Value>>);

impl Queue {
    /// Queues `cmd`. `true` when the queue was empty: the caller must then
    /// see that a [`flush`] takes it.
    pub(super) fn push(&self, cmd: Cmd) -> (Pending, bool) {
        let (reply, answer) = oneshot::channel();
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        waiting.push(Waiting { cmd, reply });
        (Pending(answer), waiting.len() == 1)
    }

    /// Everything queued, in the order it came.
    fn take(&self) -> Vec<Waiting> {
        std::mem::take(&mut *self.waiting.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Pending {
    /// The command's own answer: its value, its server error, or the error
    /// that failed its whole batch (a broken connection, a timeout).
    pub(super) async fn answer(self) -> RedisResult<Value> {
        self.0.await.unwrap_or_else(|_| {
            Err(RedisError::from((
                ErrorKind::Io,
                "the batch carrying this command was dropped",
            )))
        })
    }
}

/// Waits one turn of the runtime (the tasks already ready run first, and
/// queue their commands), then sends everything in `queue` on the
/// connection `con` gives at that moment (a replaced connection is not
/// used).
pub(super) async fn flush<C: ConnectionLike + Send>(queue: &Queue, con: impl FnOnce() -> C) {
    tokio::task::yield_now().await;
    let waiting = queue.take();
    send(&mut con(), waiting).await;
}

/// Sends `batch` on `con`, one write, and hands each command its answer.
/// Commands whose caller has gone are left out.
async fn send<C: ConnectionLike + Send>(con: &mut C, mut batch: Vec<Waiting>) {
    batch.retain(|w| !w.reply.is_closed());
    match batch.len() {
        0 => {}
        1 => {
            let Waiting { cmd, reply } = batch.pop().expect("one command");
            let answer = cmd
                .query_async::<Value>(con)
                .await
                .and_then(Value::extract_error);
            let _ = reply.send(answer);
        }
        n => {
            let mut pipe = Pipeline::with_capacity(n);
            // With `ignore_errors`, a command's server error is its own
            // answer (a `Value::ServerError`), not the pipeline's.
            pipe.ignore_errors();
            let mut replies = Vec::with_capacity(n);
            for Waiting { cmd, reply } in batch {
                pipe.add_command(cmd);
                replies.push(reply);
            }
            let answers = pipe.query_async::<Vec<Value>>(con).await.and_then(|v| {
                if v.len() == n {
                    Ok(v)
                } else {
                    Err(RedisError::from((
                        ErrorKind::Parse,
                        "a pipeline's answers did not match its commands",
                        format!("{} answers to {n} commands", v.len()),
                    )))
                }
            });
            match answers {
                Ok(values) => {
                    for (value, reply) in values.into_iter().zip(replies) {
                        let _ = reply.send(value.extract_error());
                    }
                }
                Err(e) => {
                    for reply in replies {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
            }
        }
    }
}
