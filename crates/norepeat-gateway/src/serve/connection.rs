//! Client connections: accepted up to `limits.max_connections`, each held
//! to the file's `limits`, so a connection costs the gateway nothing it
//! cannot take back.
//!
//! A connection is in one of three phases, which its socket's reads time:
//! - **head**: from its accept, or from the first byte after an idle
//!   spell, until a request head has been read: at most `header_timeout`
//!   (a head sent a line every few seconds is cut there, as NGINX's
//!   `client_header_timeout` does);
//! - **busy**: a request is in flight (its answer not yet sent whole): no
//!   socket timer, as the upstream may take its route's `timeout`; the
//!   request body is held to `body_timeout` between two pieces;
//! - **idle**: nothing in flight: closed after `idle_timeout` without a
//!   byte.
//! - **upgraded**: the connection switched protocols (a WebSocket, on an
//!   upstream's 101): closed after `idle_timeout` without a byte either
//!   way (as Envoy's `idle_timeout` and NGINX's `proxy_read_timeout` close
//!   a silent WebSocket), never while bytes flow.
//!
//! With `tls`, the handshake is read in the head phase: a client that
//! connects and says nothing is cut at `header_timeout`. HTTP/1.1 and
//! HTTP/2 are both served (by ALPN over TLS, by prior knowledge in
//! cleartext). An HTTP/2 connection's bytes while idle (its pings, window
//! updates) do not start a head: it is closed `idle_timeout` after its
//! last stream, as Envoy does.
//!
//! Past `max_connections` (one cap for the process, whichever worker's
//! listener took the connection) a new connection waits unserved until
//! one closes: each listener holds at most one such connection accepted
//! (the others wait in the listen queue), so the process has at most
//! `max_connections` plus one per worker open. An `accept` that fails for
//! lack of descriptors (`EMFILE`) backs off and keeps serving the
//! connections that are open.

use crate::config::Limits;
use axum::body::Body;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

const HEAD: u8 = 0;
const BUSY: u8 = 1;
const IDLE: u8 = 2;
const UPGRADED: u8 = 3;

/// The first bytes of an HTTP/2 connection (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0";

/// Serves `front` on `listener` until `shutdown` resolves, then lets every
/// connection finish the request it serves (the caller bounds that wait).
/// A connection holds one of `slots` while it is open (the slots may be
/// shared by several listeners: one cap for the process).
pub(super) async fn serve(
    listener: tokio::net::TcpListener,
    front: super::admin::Front,
    limits: Limits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    slots: Arc<Semaphore>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
    // HTTP/2's extended CONNECT (RFC 8441, a WebSocket over an HTTP/2
    // stream) is not offered: upstreams are spoken to in HTTP/1.1, so a
    // browser opens its WebSockets over HTTP/1.1 connections, whose
    // `Upgrade` is spliced through (see `forward`).
    let mut builder = Builder::new(TokioExecutor::new());
    // Each stream may hold a backend connection: one client connection
    // holds at most this many.
    builder
        .http2()
        .max_concurrent_streams(limits.max_streams.get());
    // An answer's head and its small body in one buffer, one iovec: 3-4 %
    // less CPU per request than hyper's vectored writes here (BENCHMARKS.md,
    // issue 39); a large body costs one more copy.
    builder.http1().writev(false);
    // For a connection the lane hands over once the shutdown has begun
    // (a head that was still coming): its request is served, then the
    // connection closes. hyper's graceful shutdown would close it before
    // reading the request it already holds.
    let mut closing = builder.clone();
    closing.http1().keep_alive(false);
    let closing = Arc::new(closing);
    let builder = Arc::new(builder);
    let mut shutdown = std::pin::pin!(shutdown);
    let stop = Arc::new(Stop::default());
    let mut pause = ACCEPT_PAUSE;
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => {
                    pause = ACCEPT_PAUSE;
                    a
                }
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    // Out of descriptors (`EMFILE`, `ENFILE`) or memory:
                    // wait for connections to close, keep serving them.
                    tracing::error!(error = %e, "accept failed; trying again in {pause:?}");
                    metrics::counter!("norepeat_gateway_accept_errors_total").increment(1);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_ACCEPT_PAUSE);
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Past the cap the accepted connection waits here, unread, for a
        // slot, and this listener accepts no other meanwhile. The slot is
        // taken after the accept, not before: with a listener per worker,
        // a slot held by a worker waiting for a connection that never
        // comes would keep a connection queued at another worker waiting
        // although the process is under its cap.
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let watch = Arc::new(Watch::new());
        // The slot goes with the socket: an upgraded connection, served
        // on after hyper lets it go, still holds it.
        let timed = Timed::new(stream, Arc::clone(&watch), limits, slot, tls.is_none());
        let gw = Arc::clone(front.gateway());
        let admin = front.is_admin();
        let front = front.clone();
        let secure = tls.is_some();
        let service_watch = Arc::clone(&watch);
        let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
            // The whole request counts from its head's first byte (an
            // HTTP/1 head is timed from there; an HTTP/2 stream has no
            // such phase: from now).
            let began = match service_watch.phase.load(Ordering::Acquire) {
                HEAD => service_watch.since(),
                _ => Instant::now(),
            };
            let in_flight = InFlight::start(&service_watch);
            let mut req = req.map(|b| {
                let paused = tower_http::timeout::TimeoutBody::new(limits.body_timeout, b);
                if http_body::Body::is_end_stream(&paused) {
                    Body::new(paused)
                } else {
                    Body::new(Deadline::new(
                        Body::new(paused),
                        began + limits.request_timeout,
                    ))
                }
            });
            req.extensions_mut().insert(ConnectInfo(peer));
            if secure {
                req.extensions_mut().insert(super::forward::Secure);
            }
            if req.version() == http::Version::HTTP_2 {
                join_cookies(req.headers_mut());
            }
            let front = front.clone();
            let watch = Arc::clone(&service_watch);
            async move {
                let res = front.call(req).await;
                if res.status() == http::StatusCode::SWITCHING_PROTOCOLS {
                    watch.enter(UPGRADED);
                }
                // The request is in flight until its answer is sent whole
                // (or dropped): the guard goes with the body.
                Ok::<_, std::convert::Infallible>(res.map(|b| Body::new(Tracked(b, in_flight))))
            }
        });
        let builder = Arc::clone(&builder);
        let closing = Arc::clone(&closing);
        // Held while the connection is served, by the lane too: the
        // shutdown waits for it.
        let watcher = graceful.watcher();
        let tls = tls.clone();
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            // Handed over by the lane once the shutdown had begun.
            let mut late = false;
            let io = match tls {
                // The admin listener's: hyper's alone.
                None if admin => Io::Plain(timed),
                // Cleartext: the pass-through's lane first, hyper from the
                // first request the lane does not take.
                None => {
                    let mut timed = timed;
                    let mut read = bytes::BytesMut::new();
                    let left =
                        super::passthrough::serve(&mut timed, &mut read, &watch, peer, &gw, &stop)
                            .await;
                    if left == super::passthrough::Left::Closed {
                        return;
                    }
                    timed.unread = read.freeze();
                    late = stop.stopped();
                    Io::Plain(timed)
                }
                // Within `header_timeout`: the handshake is read in the
                // head phase.
                Some(acceptor) => match acceptor.accept(timed).await {
                    Ok(stream) => {
                        if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
                            watch.multiplexed.store(true, Ordering::Release);
                        }
                        Io::Tls(Box::new(stream))
                    }
                    Err(e) => {
                        tracing::trace!(error = %e, "TLS handshake failed");
                        return;
                    }
                },
            };
            let ended = if late {
                // The watcher, held to the end, keeps the shutdown waiting.
                let ended = closing
                    .serve_connection_with_upgrades(TokioIo::new(io), service)
                    .await;
                drop(watcher);
                ended
            } else {
                watcher
                    .watch(
                        builder
                            .serve_connection_with_upgrades(TokioIo::new(io), service)
                            .into_owned(),
                    )
                    .await
            };
            if let Err(e) = ended {
                // A head the parser refused is answered by hyper itself
                // (400, 414 or 431), before any route: it gets its line
                // here.
                if let Some(sink) = &gw.access
                    && let Some(status) = refused_by_parser(&*e)
                {
                    super::access::refused_head(sink, status);
                }
                tracing::trace!(error = %e, "connection ended");
            }
        });
    }
    drop(listener);
    stop.stop();
    graceful.shutdown().await;
    Ok(())
}

/// The status hyper answered a request head it could not parse with, if
/// that is why the connection ended (its `on_error`'s mapping).
fn refused_by_parser(e: &(dyn std::error::Error + 'static)) -> Option<u16> {
    let e = e.downcast_ref::<hyper::Error>()?;
    if e.is_parse_too_large() {
        // hyper tells the two apart only in its message.
        return Some(if e.to_string().contains("URI") {
            414
        } else {
            431
        });
    }
    (e.is_parse() && !e.is_parse_status()).then_some(400)
}

/// The first pause after a failed `accept`, doubled up to [`MAX_ACCEPT_PAUSE`].
const ACCEPT_PAUSE: Duration = Duration::from_millis(10);
const MAX_ACCEPT_PAUSE: Duration = Duration::from_secs(1);

/// A client that went away before its connection was accepted.
fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

/// An HTTP/2 request's `cookie` fields joined into one with `"; "` (RFC
/// 9113 §8.2.3), as an HTTP/1.1 request carries them, before anything
/// reads them (the identity, the backend).
fn join_cookies(headers: &mut http::HeaderMap) {
    let mut values = headers.get_all(http::header::COOKIE).iter();
    let (Some(first), Some(_)) = (values.next(), values.next()) else {
        return;
    };
    let mut joined = first.as_bytes().to_vec();
    for v in headers.get_all(http::header::COOKIE).iter().skip(1) {
        joined.extend_from_slice(b"; ");
        joined.extend_from_slice(v.as_bytes());
    }
    if let Ok(v) = http::HeaderValue::from_bytes(&joined) {
        headers.insert(http::header::COOKIE, v);
    }
}

/// The client's socket, in the clear or under TLS.
enum Io {
    Plain(Timed),
    Tls(Box<tokio_rustls::server::TlsStream<Timed>>),
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// The listener's shutdown, as the pass-through's lane sees it: a
/// connection waiting for a next request closes at once, one whose
/// request (or its head) is under way closes after its answer.
#[derive(Default)]
pub(super) struct Stop {
    stopped: AtomicBool,
    told: tokio::sync::Notify,
}

impl Stop {
    fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.told.notify_waiters();
    }

    /// Whether the shutdown has begun.
    pub(super) fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Resolves once the shutdown has begun.
    pub(super) async fn wait(&self) {
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
pub(super) struct Watch {
    phase: AtomicU8,
    /// An HTTP/2 connection: its bytes while idle start no head.
    multiplexed: AtomicBool,
    in_flight: AtomicUsize,
    since: Mutex<Instant>,
    /// The socket's reader, when it last waited: woken when the phase
    /// changes, to arm the new phase's timer (hyper does not read again
    /// on its own once an answer is sent).
    reader: Mutex<Option<std::task::Waker>>,
}

impl Watch {
    fn new() -> Self {
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

    fn enter(&self, phase: u8) {
        *self
            .since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
        self.phase.store(phase, Ordering::Release);
    }

    fn since(&self) -> Instant {
        *self
            .since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One request in flight on its connection; the connection is idle again
/// once the last one's answer is sent (or dropped).
pub(super) struct InFlight(Arc<Watch>);

impl InFlight {
    pub(super) fn start(watch: &Arc<Watch>) -> Self {
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
struct Tracked(Body, #[allow(dead_code)] InFlight);

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
struct Deadline<B> {
    inner: B,
    timer: Pin<Box<Sleep>>,
}

impl<B> Deadline<B> {
    fn new(inner: B, at: Instant) -> Self {
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
struct Timed {
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
    unread: bytes::Bytes,
}

impl Timed {
    fn new(
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
