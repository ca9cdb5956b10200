//! A client connection's phases and their timers (see the `connection`
//! module's docs): the socket whose reads are timed by its phase
//! ([`Timed`]), the requests in flight ([`InFlight`]), the listener's
//! shutdown as a connection sees it ([`Stop`]), a request body held to
//! `request_timeout` ([`Deadline`]).

use crate::config::Limits;
use axum::body::Body;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};

pub(super) const HEAD: u8 = 0;
pub(super) const BUSY: u8 = 1;
pub(super) const IDLE: u8 = 2;
pub(super) const UPGRADED: u8 = 3;

/// The first bytes of an HTTP/2 connection (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0";

/// The listener's shutdown, as the pass-through's lane sees it: a
/// connection waiting for a next request closes at once, one whose
/// request (or its head) is under way closes after its answer.
#[derive(Default)]
pub(crate) struct Stop {
    stopped: AtomicBool,
    told: tokio::sync::Notify,
}

impl Stop {
    pub(super) fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.told.notify_waiters();
    }

    /// Whether the shutdown has begun.
    pub(crate) fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Resolves once the shutdown has begun.
    pub(crate) async fn wait(&self) {
        let told = self.told.notified();
        let mut told = std::pin::pin!(told);
        told.as_mut().enable();
        if self.stopped() {
            return;
        }
        told.await;
    }
}

/// A connection's phase and since when (see the module docs).
pub(crate) struct Watch {
    pub(super) phase: AtomicU8,
    /// An HTTP/2 connection: its bytes while idle start no head.
    pub(super) multiplexed: AtomicBool,
    in_flight: AtomicUsize,
    since: Mutex<Instant>,
    /// The socket's reader, when it last waited: woken when the phase
    /// changes, to arm the new phase's timer (hyper does not read again
    /// on its own once an answer is sent).
    reader: Mutex<Option<std::task::Waker>>,
}

impl Watch {
    pub(super) fn new() -> Self {
        Self {
            phase: AtomicU8::new(HEAD),
            multiplexed: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            since: Mutex::new(Instant::now()),
            reader: Mutex::new(None),
        }
    }

    /// Keeps `waker` to wake when the phase changes.
    fn waiting(&self, waker: &std::task::Waker) {
        let mut reader = self
            .reader
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !reader.as_ref().is_some_and(|w| w.will_wake(waker)) {
            *reader = Some(waker.clone());
        }
    }

    pub(super) fn enter(&self, phase: u8) {
        *self
            .since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
        self.phase.store(phase, Ordering::Release);
    }

    pub(super) fn since(&self) -> Instant {
        *self
            .since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One request in flight on its connection; the connection is idle again
/// once the last one's answer is sent (or dropped).
pub(crate) struct InFlight(Arc<Watch>);

impl InFlight {
    pub(crate) fn start(watch: &Arc<Watch>) -> Self {
        watch.in_flight.fetch_add(1, Ordering::AcqRel);
        watch.phase.store(BUSY, Ordering::Release);
        Self(Arc::clone(watch))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            // An upgraded connection stays so: its answer (the 101) is
            // sent, its bytes go on.
            if self.0.phase.load(Ordering::Acquire) != UPGRADED {
                self.0.enter(IDLE);
            }
            let reader = self
                .0
                .reader
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            if let Some(w) = reader {
                w.wake();
            }
        }
    }
}

/// A response body that keeps its request in flight until it is dropped.
pub(super) struct Tracked(pub(super) Body, #[allow(dead_code)] pub(super) InFlight);

impl http_body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.0).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.0.size_hint()
    }
}

/// A request body that fails once its request has lasted
/// `limits.request_timeout`: a body trickled a byte at a time never pauses
/// past `body_timeout`, and would hold its connection (and a backend's)
/// for ever. The request is then answered as any broken body is.
pub(super) struct Deadline<B> {
    inner: B,
    timer: Pin<Box<Sleep>>,
}

impl<B> Deadline<B> {
    pub(super) fn new(inner: B, at: Instant) -> Self {
        Self {
            inner,
            timer: Box::pin(tokio::time::sleep_until(at)),
        }
    }
}

impl<B> http_body::Body for Deadline<B>
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = bytes::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if this.timer.as_mut().poll(cx).is_ready() {
            metrics::counter!("norepeat_gateway_connections_timed_out_total", "phase" => "request")
                .increment(1);
            return Poll::Ready(Some(Err(Box::new(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the request past limits.request_timeout",
            )))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The client's socket, its reads timed by its connection's phase.
pub(super) struct Timed {
    stream: TcpStream,
    watch: Arc<Watch>,
    limits: Limits,
    timer: Pin<Box<Sleep>>,
    armed: Option<Instant>,
    /// The connection's place under `max_connections`, held as long as
    /// the socket.
    _slot: OwnedSemaphorePermit,
    /// Cleartext, first bytes not yet seen: they tell HTTP/2's preface.
    sniff: bool,
    /// Bytes read by the pass-through's lane and not used, read first.
    pub(super) unread: bytes::Bytes,
}

impl Timed {
    pub(super) fn new(
        stream: TcpStream,
        watch: Arc<Watch>,
        limits: Limits,
        slot: OwnedSemaphorePermit,
        cleartext: bool,
    ) -> Self {
        Self {
            stream,
            watch,
            limits,
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
            armed: None,
            _slot: slot,
            sniff: cleartext,
            unread: bytes::Bytes::new(),
        }
    }
}

impl Timed {
    /// Bytes sent on an upgraded connection keep it alive as bytes read
    /// do: its silence is counted from the last byte either way.
    fn wrote(&self, written: &Poll<std::io::Result<usize>>) {
        if matches!(written, Poll::Ready(Ok(n)) if *n > 0)
            && self.watch.phase.load(Ordering::Acquire) == UPGRADED
        {
            self.watch.enter(UPGRADED);
        }
    }
}

impl AsyncRead for Timed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if !this.unread.is_empty() {
            let n = this.unread.len().min(buf.remaining());
            buf.put_slice(&this.unread.split_to(n));
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = &buf.filled()[before..];
                if this.sniff && !read.is_empty() {
                    this.sniff = false;
                    let n = read.len().min(PREFACE.len());
                    if read[..n] == PREFACE[..n] {
                        this.watch.multiplexed.store(true, Ordering::Release);
                    }
                }
                if !read.is_empty() {
                    match this.watch.phase.load(Ordering::Acquire) {
                        // The first byte of a next request: its head is
                        // timed (HTTP/2's pings and window updates are not
                        // one).
                        IDLE if !this.watch.multiplexed.load(Ordering::Acquire) => {
                            this.watch.enter(HEAD);
                        }
                        UPGRADED => this.watch.enter(UPGRADED),
                        _ => {}
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                this.watch.waiting(cx.waker());
                let (limit, what) = match this.watch.phase.load(Ordering::Acquire) {
                    HEAD => (this.limits.header_timeout, "request head"),
                    IDLE => (this.limits.idle_timeout, "idle connection"),
                    UPGRADED => (this.limits.idle_timeout, "upgraded connection"),
                    _ => return Poll::Pending,
                };
                let deadline = this.watch.since() + limit;
                if this.armed != Some(deadline) {
                    this.timer.as_mut().reset(deadline);
                    this.armed = Some(deadline);
                }
                if this.timer.as_mut().poll(cx).is_ready() {
                    metrics::counter!("norepeat_gateway_connections_timed_out_total", "phase" => match what { "request head" => "head", "idle connection" => "idle", _ => "upgraded" }).increment(1);
                    return Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("{what} past its limit of {limit:?}"),
                    )));
                }
                Poll::Pending
            }
        }
    }
}

impl AsyncWrite for Timed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.wrote(&written);
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.wrote(&written);
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
