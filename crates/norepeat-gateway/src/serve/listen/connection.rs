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

use super::timed::{Deadline, HEAD, InFlight, Stop, Timed, Tracked, UPGRADED, Watch};
use crate::config::Limits;
use crate::serve::upstream::pause::PauseLimited;
use axum::body::Body;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// Serves `front` on `listener` until `shutdown` resolves, then lets every
/// connection finish the request it serves (the caller bounds that wait).
/// A connection holds one of `slots` while it is open (the slots may be
/// shared by several listeners: one cap for the process).
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    front: crate::serve::own::Front,
    limits: Limits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    slots: Arc<Semaphore>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
    // HTTP/2's extended CONNECT (RFC 8441, a WebSocket over an HTTP/2
    // stream) is not offered: upstreams are spoken to in HTTP/1.1, so a
    // browser opens its WebSockets over HTTP/1.1 connections, whose
    // `Upgrade` is spliced through (see `upstream`).
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
                let paused = PauseLimited::new(b, limits.body_timeout);
                if http_body::Body::is_end_stream(&paused) {
                    Body::new(paused)
                } else {
                    Body::new(Deadline::new(paused, began + limits.request_timeout))
                }
            });
            req.extensions_mut().insert(ConnectInfo(peer));
            if secure {
                req.extensions_mut()
                    .insert(crate::serve::upstream::pool::Secure);
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
                    let left = crate::serve::listen::lane::serve(
                        &mut timed, &mut read, &watch, peer, &gw, &stop,
                    )
                    .await;
                    if left == crate::serve::listen::lane::Left::Closed {
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
                    crate::serve::log::access::refused_head(sink, status);
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
