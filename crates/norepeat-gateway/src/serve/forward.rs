//! Forwarding written by us: HTTP/1.1 connections pooled per worker and
//! per route ([`Client`]), spoken to by hand (`h1.rs`) for a request whose
//! body is in hand and by hyper's client for the others, streamed bodies
//! both ways, hop-by-hop headers dropped both ways (RFC 9110 §7.6.1), the
//! `X-Forwarded-*` and `Forwarded` headers added, `Host` kept; an
//! `https://` upstream over rustls, and an HTTP/1.1 `Upgrade` (WebSocket
//! and others) spliced through once the upstream answers 101.

use axum::body::Body;
use axum::extract::ConnectInfo;
use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, Uri, Version, header};
use http_body::{Frame, SizeHint};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// The TLS settings of every client made from now on: the roots of the
/// file's `upstream_ca` (or the system's), set when a gateway is built.
static UPSTREAM_TLS: std::sync::Mutex<Option<std::sync::Arc<rustls::ClientConfig>>> =
    std::sync::Mutex::new(None);

/// Checks `https://` upstreams against `ca`'s roots (the system's for
/// `None`) in every client made from now on.
/// `https`: the file names an `https://` upstream (a missing root store is
/// then worth a warning).
pub(crate) fn use_upstream_ca(ca: Option<&crate::config::UpstreamCa>, https: bool) {
    *UPSTREAM_TLS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) =
        Some(super::tls::client_config(ca, https));
}

/// A request that came over TLS: forwarded with `proto=https`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Secure;

/// The longest a connection attempt may take.
pub(crate) const MAX_CONNECT: Duration = Duration::from_secs(5);

/// How long a route whose answer must come within `timeout` lets a
/// connection attempt take: half of it (at most 5 s), so a backend that
/// silently drops connection attempts is a connect error (502: nothing
/// reached it, the key is released) before the route's timeout makes it
/// an unknown outcome (504).
#[must_use]
pub(crate) fn connect_timeout(timeout: Duration) -> Duration {
    (timeout / 2).min(MAX_CONNECT)
}

/// One client of `to` per worker (see `workers.rs`), each with its own
/// idle connections, giving up on a connection attempt after `connect`.
#[must_use]
pub(crate) fn client(connect: Duration, to: Target) -> Pool {
    std::sync::Arc::new(super::workers::PerWorker::new(|| {
        Client::new(connect, to.clone())
    }))
}

/// The upstream clients of a route (or of the pass-through), one per
/// worker: a request uses its worker's ([`super::workers::PerWorker::get`]).
pub(crate) type Pool = std::sync::Arc<super::workers::PerWorker<Client>>;

/// How long an idle upstream connection is kept for a next request.
const IDLE_FOR: Duration = Duration::from_secs(30);

/// The most idle connections a client keeps (the ones past it close).
const MAX_IDLE: usize = 1024;

/// The HTTP/1.1 connections of one route's upstream (or of the
/// pass-through's) on one worker: made when none is idle, kept while idle
/// for the next request, for [`IDLE_FOR`].
///
/// Ours rather than hyper-util's pooled client: a client has one upstream
/// (a reload that changes it makes new clients), so there is no key to
/// hash, and a connection goes back to the idle ones when its answer's
/// body ends, where hyper-util's spawned a task per request to wait for
/// that (together 8 % of a pass-through request's instructions;
/// BENCHMARKS.md, issue 39). A request is tried again on another
/// connection only when the one it was given closed before a byte of it
/// was written: nothing reached the backend.
pub(crate) struct Client {
    connector: HttpsConnector<HttpConnector>,
    to: Target,
    idle: std::sync::Arc<std::sync::Mutex<VecDeque<Idle>>>,
    /// Plain sockets spoken HTTP/1.1 on by hand (`h1.rs`: the lane's,
    /// and a route's request whose body is in hand), kept as hyper's are.
    raw: std::sync::Arc<RawPool>,
    /// Gives a connection back to `raw` (what an answer's body calls at
    /// its end).
    give_back: super::h1::Idle,
    connect: Duration,
}

/// A connection waiting for its next request, since when.
struct Parked<C> {
    conn: C,
    since: std::time::Instant,
}

/// A hyper client connection waiting.
type Idle = Parked<hyper::client::conn::http1::SendRequest<Body>>;
/// A plain connection waiting (`h1.rs`).
type RawIdle = Parked<tokio::net::TcpStream>;

/// The plain idle connections (`h1.rs`, the pass-through's lane). No task
/// watches each, as hyper's connection task does: while any waits, one
/// sweep a second ([`sweep`]) closes those the upstream closed (else they
/// would wait in `CLOSE_WAIT` until the next request) or that waited past
/// [`IDLE_FOR`].
#[derive(Default)]
struct RawPool {
    idle: std::sync::Mutex<VecDeque<RawIdle>>,
    /// A sweep is under way.
    sweeping: std::sync::atomic::AtomicBool,
}

/// How often the plain idle connections are looked at.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

impl RawPool {
    /// Keeps `conn`, and makes sure a sweep will look at it.
    fn park(self: &std::sync::Arc<Self>, conn: tokio::net::TcpStream) {
        park(&self.idle, conn);
        if !self
            .sweeping
            .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(sweep(std::sync::Arc::downgrade(self)));
                }
                Err(_) => self
                    .sweeping
                    .store(false, std::sync::atomic::Ordering::Release),
            }
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, VecDeque<RawIdle>> {
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Whether `conn`, idle, is still open: nothing to read, no end read (the
/// upstream's `FIN` or anything it sent unasked ends it). Costs no system
/// call unless the socket was reported readable.
fn still_open(conn: &tokio::net::TcpStream) -> bool {
    let mut probe = [0u8; 1];
    matches!(conn.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// Once a [`SWEEP_EVERY`], closes the idle connections of `pool` the
/// upstream closed or that waited past [`IDLE_FOR`]; ends when none is
/// left (the next one parked starts another), or when the pool is gone (a
/// reload replaced its client: its connections closed with it).
async fn sweep(weak: std::sync::Weak<RawPool>) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        let Some(pool) = weak.upgrade() else {
            return;
        };
        let now = std::time::Instant::now();
        let empty = {
            let mut idle = pool.idle();
            idle.retain(|c| now.duration_since(c.since) < IDLE_FOR && still_open(&c.conn));
            idle.is_empty()
        };
        if empty {
            pool.sweeping
                .store(false, std::sync::atomic::Ordering::Release);
            // One parked since saw this sweep under way: go on for it.
            if pool.idle().is_empty()
                || pool
                    .sweeping
                    .swap(true, std::sync::atomic::Ordering::AcqRel)
            {
                return;
            }
        }
    }
}

/// Keeps `conn` among `idle`, the oldest dropped past [`IDLE_FOR`] or
/// [`MAX_IDLE`].
fn park<C>(idle: &std::sync::Mutex<VecDeque<Parked<C>>>, conn: C) {
    let mut idle = idle
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let now = std::time::Instant::now();
    while idle
        .front()
        .is_some_and(|c| now.duration_since(c.since) >= IDLE_FOR)
        || idle.len() >= MAX_IDLE
    {
        idle.pop_front();
    }
    idle.push_back(Parked { conn, since: now });
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}

/// Why [`Client::send`] has no answer.
enum SendError {
    /// No connection: nothing reached the backend.
    Connect,
    /// The request went (or may have gone) and no answer came.
    Request(Box<dyn std::error::Error + Send + Sync>),
    /// The request went and a 101 came that it did not ask for.
    Switched,
}

impl Client {
    fn new(connect: Duration, to: Target) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(connect));
        // `https://` too: the TLS connector below takes those.
        connector.enforce_http(false);
        let tls = UPSTREAM_TLS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_or_insert_with(|| super::tls::client_config(None, false))
            .clone();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(std::sync::Arc::unwrap_or_clone(tls))
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        let raw: std::sync::Arc<RawPool> = std::sync::Arc::default();
        let give_back: super::h1::Idle = {
            let raw = std::sync::Arc::clone(&raw);
            std::sync::Arc::new(move |stream| raw.park(stream))
        };
        Self {
            connector,
            to,
            idle: std::sync::Arc::default(),
            raw,
            give_back,
            connect,
        }
    }

    /// Whether the upstream is spoken to in the clear (`http://`): the
    /// pass-through's lane takes only those.
    pub(crate) fn is_plain(&self) -> bool {
        self.to.origin.scheme() == Some(&http::uri::Scheme::HTTP)
    }

    /// The upstream's base path (`/base`), none for `/`.
    pub(crate) fn base(&self) -> Option<&str> {
        self.to.base.as_deref()
    }

    /// The most recently idle plain connection that is still open: one
    /// whose socket has nothing to read (a backend that closed it, or
    /// wrote out of turn, leaves it readable). The check is the reactor's
    /// readiness first: usually no system call when nothing came. A close
    /// that the reactor has not seen yet is missed (as by hyper's pool):
    /// the request then meets it, and is answered 504, never sent again.
    pub(crate) fn take_raw(&self) -> Option<tokio::net::TcpStream> {
        let mut idle = self.raw.idle();
        while let Some(c) = idle.pop_back() {
            if c.since.elapsed() >= IDLE_FOR {
                idle.clear();
                return None;
            }
            if still_open(&c.conn) {
                return Some(c.conn);
            }
        }
        None
    }

    /// Keeps `stream` for a next request.
    pub(crate) fn put_raw(&self, stream: tokio::net::TcpStream) {
        self.raw.park(stream);
    }

    /// A new plain connection to the upstream, within the client's
    /// connection timeout.
    pub(crate) async fn connect_raw(&self) -> std::io::Result<tokio::net::TcpStream> {
        let host = self.to.authority.host();
        // `[::1]` is the authority's spelling of an IPv6 address.
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let port = self.to.authority.port_u16().unwrap_or(80);
        let stream =
            match tokio::time::timeout(self.connect, tokio::net::TcpStream::connect((host, port)))
                .await
            {
                Ok(connected) => connected?,
                Err(_) => return Err(std::io::ErrorKind::TimedOut.into()),
            };
        stream.set_nodelay(true)?;
        Ok(stream)
    }

    /// The most recently idle connection that is still open.
    fn take(&self) -> Option<hyper::client::conn::http1::SendRequest<Body>> {
        let mut idle = self
            .idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while let Some(c) = idle.pop_back() {
            if c.since.elapsed() >= IDLE_FOR {
                // The most recent is too old: so are the others.
                idle.clear();
                return None;
            }
            if !c.conn.is_closed() {
                return Some(c.conn);
            }
        }
        None
    }

    /// A new connection, its task spawned on the calling runtime.
    async fn connect(&self) -> Result<hyper::client::conn::http1::SendRequest<Body>, SendError> {
        let io = tower::ServiceExt::oneshot(self.connector.clone(), self.to.origin.clone())
            .await
            .map_err(|_| SendError::Connect)?;
        // One buffer per write, as on the client's side (`connection.rs`).
        let (send, conn) = hyper::client::conn::http1::Builder::new()
            .writev(false)
            .handshake(io)
            .await
            .map_err(|_| SendError::Connect)?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "upstream connection ended");
            }
        });
        Ok(send)
    }

    /// Sends `req` (its URI in origin form, its `Host` set) on an idle
    /// connection or a new one; the connection goes back to the idle ones
    /// when the answer's body has ended. A request to an `http://` upstream
    /// whose body is in hand (none, or one read whole already: a guarded
    /// route's) is written by hand (`h1.rs`); the others, an upgrade, a
    /// streaming upload, an `https://` upstream, by hyper's client.
    /// `forwarding`: the gateway's headers, not yet applied (none for an
    /// upgrade, hyper's, whose headers are already).
    async fn send(
        &self,
        mut req: Request<Body>,
        forwarding: Option<&Forwarding>,
    ) -> Result<Response<Body>, SendError> {
        let by_hand = forwarding.filter(|_| {
            self.is_plain()
                && !req.headers().contains_key(header::UPGRADE)
                && super::h1::body_in_hand(&req)
        });
        let Some(forwarding) = by_hand else {
            if let Some(f) = forwarding {
                f.apply(req.headers_mut());
            }
            return self.send_by_hyper(req).await;
        };
        let (mut parts, body) = req.into_parts();
        let body = match in_hand(body).await {
            InHand::Whole(bytes) => bytes,
            InHand::Broke(e) => return Err(SendError::Request(e)),
            InHand::Streaming(body) => {
                forwarding.apply(&mut parts.headers);
                return self.send_by_hyper(Request::from_parts(parts, body)).await;
            }
        };
        let uri = std::mem::take(&mut parts.uri);
        let target = uri.path_and_query().map_or("/", PathAndQuery::as_str);
        super::h1::exchange(
            self.take_raw(),
            || self.connect_raw(),
            (parts, forwarding),
            target.as_bytes(),
            body,
            std::sync::Arc::clone(&self.give_back),
        )
        .await
        .map_err(|e| match e {
            super::h1::Failed::Unavailable => SendError::Connect,
            super::h1::Failed::Unknown(e) => SendError::Request(Box::new(e)),
            super::h1::Failed::Switched => SendError::Switched,
        })
    }

    /// [`Client::send`] by hyper's client connections.
    async fn send_by_hyper(&self, mut req: Request<Body>) -> Result<Response<Body>, SendError> {
        loop {
            let (mut send, reused) = match self.take() {
                Some(send) => (send, true),
                None => (self.connect().await?, false),
            };
            // A connection given back as its answer's body ended may still
            // be finishing that answer: a moment, on this thread.
            if send.ready().await.is_err() {
                if reused {
                    continue;
                }
                return Err(SendError::Connect);
            }
            match send.try_send_request(req).await {
                Ok(res) => {
                    let (parts, body) = res.into_parts();
                    // A switched connection is the upgrade's, never idle.
                    let back =
                        (parts.status != http::StatusCode::SWITCHING_PROTOCOLS).then(|| GiveBack {
                            send,
                            idle: std::sync::Arc::clone(&self.idle),
                        });
                    let mut body = Returning { body, back };
                    if http_body::Body::is_end_stream(&body.body) {
                        body.give_back();
                    }
                    return Ok(Response::from_parts(parts, Body::new(body)));
                }
                Err(mut e) => match e.take_message() {
                    // Not a byte of it written: another connection (a new
                    // one only once).
                    Some(unsent) if reused => req = unsent,
                    Some(_) => return Err(SendError::Connect),
                    None => return Err(SendError::Request(Box::new(e.into_error()))),
                },
            }
        }
    }
}

/// A request body, taken as far as it is already there.
enum InHand {
    /// All of it.
    Whole(Bytes),
    /// It broke (the client's side).
    Broke(Box<dyn std::error::Error + Send + Sync>),
    /// More is still to come: the body, with what was taken put back.
    Streaming(Body),
}

/// Takes `body`'s frames while each is ready at once: a body read whole
/// already (a guarded route's), or a small one that came with its head,
/// is [`InHand::Whole`].
async fn in_hand(mut body: Body) -> InHand {
    let mut taken: Option<Bytes> = None;
    let mut more = bytes::BytesMut::new();
    let done = std::future::poll_fn(|cx| {
        loop {
            match http_body::Body::poll_frame(Pin::new(&mut body), cx) {
                Poll::Ready(None) => return Poll::Ready(Ok(true)),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) if taken.is_none() && more.is_empty() => taken = Some(data),
                    Ok(data) => {
                        let data: Bytes = data;
                        if let Some(first) = taken.take() {
                            more.extend_from_slice(&first);
                        }
                        more.extend_from_slice(&data);
                    }
                    // Trailers, which a body of a known length (the only
                    // kind taken here) cannot have: hyper's client then
                    // sends the rest, these trailers not among it.
                    Err(_) => return Poll::Ready(Ok(false)),
                },
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Ready(Ok(false)),
            }
            if http_body::Body::is_end_stream(&body) {
                return Poll::Ready(Ok(true));
            }
        }
    })
    .await;
    let got = match taken {
        Some(first) => first,
        None => more.freeze(),
    };
    match done {
        Ok(true) => InHand::Whole(got),
        // What was taken, put back in front: the read-ahead body's shape.
        Ok(false) => InHand::Streaming(Body::new(ReadAhead {
            buffered: got.len() as u64,
            frames: (!got.is_empty())
                .then(|| Frame::data(got))
                .into_iter()
                .collect(),
            rest: Some(body),
        })),
        Err(e) => InHand::Broke(e.into()),
    }
}

/// A connection to give back once its answer's body has ended.
struct GiveBack {
    send: hyper::client::conn::http1::SendRequest<Body>,
    idle: std::sync::Arc<std::sync::Mutex<VecDeque<Idle>>>,
}

/// An answer's body from a pooled connection: the connection goes back to
/// the idle ones at its end (a body dropped before it closes the
/// connection, as hyper does for an answer not read whole).
struct Returning {
    body: hyper::body::Incoming,
    back: Option<GiveBack>,
}

impl Returning {
    /// Gives the connection back: at once when it is ready for the next
    /// request (the usual case), else from a task that waits until it is.
    /// The answer may have ended before the request did (a backend that
    /// answers 413 while the client still uploads): that connection is busy
    /// until the upload ends, and a request given it would wait as long.
    fn give_back(&mut self) {
        let Some(mut back) = self.back.take() else {
            return;
        };
        // Closed after its answer (`Connection: close`): nothing to keep.
        if back.send.is_closed() {
            return;
        }
        if back.send.is_ready() {
            back.park();
            return;
        }
        tokio::spawn(async move {
            if let Ok(Ok(())) = tokio::time::timeout(IDLE_FOR, back.send.ready()).await {
                back.park();
            }
        });
    }
}

impl GiveBack {
    /// Among the idle connections, the oldest dropped past [`IDLE_FOR`]
    /// or [`MAX_IDLE`].
    fn park(self) {
        park(&self.idle, self.send);
    }
}

impl http_body::Body for Returning {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.give_back(),
            Poll::Ready(Some(Ok(_))) if self.body.is_end_stream() => self.give_back(),
            Poll::Ready(Some(Err(_))) => self.back = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// An upstream's URL (`http://host:port[/base]`), taken apart once when
/// the file is read: a request's URI is put together from its parts and
/// the request's path, with no text formatted or parsed per request.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    authority: http::uri::Authority,
    /// `scheme://authority`: what a connection is made to.
    origin: Uri,
    /// The path every request's goes under (`/base`), none for `/`.
    base: Option<Box<str>>,
}

impl Target {
    /// `upstream`'s parts.
    pub(crate) fn new(upstream: &crate::config::Upstream) -> Self {
        let uri = upstream.uri();
        let base = uri.path().trim_end_matches('/');
        // Both there: the file's check parsed the URL.
        let scheme = uri.scheme().cloned().unwrap_or(http::uri::Scheme::HTTP);
        let authority = uri
            .authority()
            .cloned()
            .unwrap_or(http::uri::Authority::from_static("localhost"));
        let mut origin = http::uri::Parts::default();
        origin.scheme = Some(scheme);
        origin.authority = Some(authority.clone());
        origin.path_and_query = Some(PathAndQuery::from_static("/"));
        Self {
            origin: Uri::from_parts(origin).unwrap_or_default(),
            authority,
            base: (!base.is_empty()).then(|| base.into()),
        }
    }

    /// The target a request for `pq` is sent with (origin form): the
    /// request's path and query under the base path.
    fn uri(&self, pq: Option<&PathAndQuery>) -> Option<Uri> {
        let pq = match (&self.base, pq) {
            (None, Some(pq)) => pq.clone(),
            (None, None) => PathAndQuery::from_static("/"),
            (Some(base), pq) => {
                let pq = pq.map_or("/", PathAndQuery::as_str);
                let mut joined = String::with_capacity(base.len() + pq.len());
                joined.push_str(base);
                joined.push_str(pq);
                PathAndQuery::try_from(joined).ok()?
            }
        };
        Some(Uri::from(pq))
    }
}

/// Why no answer came from the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The connection could not be made: nothing reached the backend.
    Unavailable,
    /// No answer within the timeout, or the connection broke after the
    /// request was sent: the outcome is unknown.
    Timeout,
    /// The client's own body broke off (a malformed chunk, a stall past
    /// `body_timeout`): the backend never got a whole request. The
    /// client's 400, not the upstream's fault.
    ClientBody,
    /// The upstream answered 101 to a request that did not ask for that
    /// protocol: the connection is not switched (a 502 where nothing is
    /// guarded; on a guarded route the request reached the backend, so
    /// its outcome is unknown, as [`Failure::Timeout`]'s).
    Switched,
}

/// A request extension: its body is whole in memory (read by the
/// pass-through's lane before the request was made, `routed.rs`). It
/// cannot stall or break on its way, so the upstream's `timeout` counts
/// from the call, as for a request without a body, with no [`Sent`] to
/// watch it.
#[derive(Debug, Clone, Copy)]
pub(super) struct BodyInHand;

/// What became of a request body on its way to the upstream.
struct Sent {
    /// When its last piece went (or the request started): the upstream's
    /// `timeout` counts from here, so a slow upload is the client's time,
    /// not the backend's.
    last: std::sync::Mutex<tokio::time::Instant>,
    /// The client's body failed while it was read.
    broke: std::sync::atomic::AtomicBool,
}

impl Sent {
    fn new() -> Self {
        Self {
            last: std::sync::Mutex::new(tokio::time::Instant::now()),
            broke: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn progress(&self) {
        *self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = tokio::time::Instant::now();
    }

    fn last(&self) -> tokio::time::Instant {
        *self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Resolves once `timeout` has passed since the body last moved.
    async fn quiet_for(&self, timeout: Duration) {
        loop {
            let until = self.last() + timeout;
            tokio::time::sleep_until(until).await;
            if self.last() + timeout <= tokio::time::Instant::now() {
                return;
            }
        }
    }
}

/// A request body that tells [`Sent`] when it ends or breaks.
struct Watched {
    inner: Body,
    sent: std::sync::Arc<Sent>,
}

impl http_body::Body for Watched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Err(_))) => {
                self.sent
                    .broke
                    .store(true, std::sync::atomic::Ordering::Release);
            }
            Poll::Ready(_) => self.sent.progress(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The headers RFC 9110 §7.6.1 names as hop-by-hop (plus the
/// long-standing `Keep-Alive` and `Proxy-Connection`), `Connection` first.
/// Names, not strings: a `&str` is parsed into a name on every call, and
/// this runs twice per request (BENCHMARKS.md, issue 39).
pub(super) static HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Where `name` (in any case) is in [`HOP_BY_HOP`]: told by its length
/// and text, which costs less than comparing it with each of them.
pub(super) fn hop_by_hop_index(name: &str) -> Option<usize> {
    let is = |s: &str| name.eq_ignore_ascii_case(s);
    match name.len() {
        10 if is("connection") => Some(0),
        10 if is("keep-alive") => Some(1),
        16 if is("proxy-connection") => Some(2),
        2 if is("te") => Some(3),
        7 if is("trailer") => Some(4),
        17 if is("transfer-encoding") => Some(5),
        7 if is("upgrade") => Some(6),
        _ => None,
    }
}

/// `X-Forwarded-For`, `X-Forwarded-Host`, `X-Forwarded-Proto`.
pub(crate) const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub(crate) const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
pub(crate) const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Drops the hop-by-hop headers: the fixed ones, and every header that
/// `Connection` names.
///
/// ```
/// use http::HeaderMap;
/// let mut h = HeaderMap::new();
/// h.insert("connection", "close, x-secret".parse().unwrap());
/// h.insert("x-secret", "1".parse().unwrap());
/// h.insert("keep-alive", "timeout=5".parse().unwrap());
/// h.insert("x-kept", "1".parse().unwrap());
/// norepeat_gateway::serve::strip_hop_by_hop(&mut h);
/// assert_eq!(h.len(), 1);
/// assert!(h.contains_key("x-kept"));
/// ```
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the few names a request or an answer has: which of
    // the fixed ones are there (a removal hashes its name even when it
    // finds nothing).
    let mut present = [false; HOP_BY_HOP.len()];
    let mut any = false;
    for name in headers.keys() {
        if let Some(i) = hop_by_hop_index(name.as_str()) {
            present[i] = true;
            any = true;
        }
    }
    // The common request and answer: none.
    if !any {
        return;
    }
    if present[0] {
        // The names `Connection` lists, but for the fixed ones (removed
        // below) and `close`, an option rather than a name unless a
        // header is called so: `Connection: keep-alive` and `close`, the
        // common values, parse nothing.
        let mut named: Vec<HeaderName> = Vec::new();
        for token in headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|s| s.split(','))
            .map(str::trim)
        {
            let fixed = HOP_BY_HOP
                .iter()
                .any(|h| h.as_str().eq_ignore_ascii_case(token));
            if fixed || (token.eq_ignore_ascii_case("close") && !headers.contains_key("close")) {
                continue;
            }
            if let Ok(n) = HeaderName::from_bytes(token.as_bytes()) {
                named.push(n);
            }
        }
        for n in named {
            headers.remove(n);
        }
    }
    for (name, here) in HOP_BY_HOP.iter().zip(present) {
        if here {
            headers.remove(name);
        }
    }
}

/// Adds `X-Forwarded-For` (appended to the client's), `X-Forwarded-Proto`,
/// `X-Forwarded-Host` and `Forwarded` (appended), for a request from `peer`.
fn add_forwarded(
    headers: &mut HeaderMap,
    peer: Option<IpAddr>,
    host: Option<HeaderValue>,
    proto: &'static str,
) {
    let Some(peer) = peer else { return };
    // Written into buffers of their own, not through `format!`: this runs
    // on every request, and the formatting machinery was 2 % of the
    // guarded route's CPU (BENCHMARKS.md, issue 39).
    let mut ip = [0u8; 64];
    let ip = ip_text(peer, &mut ip);
    let mut xff = Vec::with_capacity(ip.len());
    for earlier in headers.get_all(&X_FORWARDED_FOR) {
        xff.extend_from_slice(earlier.as_bytes());
        xff.extend_from_slice(b", ");
    }
    xff.extend_from_slice(ip);
    if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::from(xff)) {
        headers.insert(X_FORWARDED_FOR, v);
    }
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(proto));
    let mut forwarded = Vec::with_capacity(64);
    let named = host
        .as_ref()
        .filter(|h| h.to_str().is_ok())
        .map(HeaderValue::as_bytes);
    forwarded_element(&mut forwarded, peer, ip, proto, named);
    if let Some(host) = host {
        headers.insert(X_FORWARDED_HOST, host);
    }
    if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::from(forwarded)) {
        headers.append(header::FORWARDED, v);
    }
}

/// What the gateway makes of a request's headers on its way upstream:
/// the hop-by-hop ones dropped, `Host` as the client sent it (else the
/// upstream's authority), and for a request from `peer` the forwarding
/// headers ([`add_forwarded`]). Applied to the `HeaderMap` for hyper's
/// client ([`Forwarding::apply`]), or written with the head by hand
/// ([`Forwarding::write`], `h1.rs`): the same lines, without the map's
/// removals and insertions (5 % of a guarded request's instructions).
pub(super) struct Forwarding {
    peer: Option<IpAddr>,
    /// The target's authority, else the client's `Host`.
    host: Option<HeaderValue>,
    /// The upstream's, for a request without either.
    authority: http::uri::Authority,
    proto: &'static str,
}

impl Forwarding {
    /// Edits `headers` to what the upstream gets.
    fn apply(&self, headers: &mut HeaderMap) {
        strip_hop_by_hop(headers);
        add_forwarded(headers, self.peer, self.host.clone(), self.proto);
        match &self.host {
            Some(h) => {
                headers.insert(header::HOST, h.clone());
            }
            // An HTTP/1.0 request may come without one; HTTP/1.1 needs it.
            None => {
                if let Ok(h) = HeaderValue::from_str(self.authority.as_str()) {
                    headers.insert(header::HOST, h);
                }
            }
        }
    }

    /// Writes the lines `headers` would have after [`Forwarding::apply`]
    /// into `out`, but `Content-Length` (the body's own is written).
    /// `headers` is edited only when its `Connection` may name others.
    pub(super) fn write(&self, headers: &mut HeaderMap, out: &mut Vec<u8>) {
        if headers.contains_key(header::CONNECTION) {
            // The names it lists go too: the map's way (not the common
            // request: `Connection` is HTTP/1's, and `keep-alive` its
            // default).
            strip_hop_by_hop(headers);
        }
        let forwarded = self.peer.is_some();
        for (name, value) in headers.iter() {
            let replaced = name == header::CONTENT_LENGTH
                || name == header::HOST
                || hop_by_hop_index(name.as_str()).is_some()
                || (forwarded
                    && (name == X_FORWARDED_FOR
                        || name == X_FORWARDED_PROTO
                        || (self.host.is_some() && name == X_FORWARDED_HOST)));
            if !replaced {
                super::h1::header(out, name.as_str().as_bytes(), value.as_bytes());
            }
        }
        let host = self
            .host
            .as_ref()
            .map_or(self.authority.as_str().as_bytes(), HeaderValue::as_bytes);
        super::h1::header(out, b"host", host);
        let Some(peer) = self.peer else { return };
        let mut ip = [0u8; 64];
        let ip = ip_text(peer, &mut ip);
        out.extend_from_slice(b"x-forwarded-for: ");
        for earlier in headers.get_all(X_FORWARDED_FOR) {
            out.extend_from_slice(earlier.as_bytes());
            out.extend_from_slice(b", ");
        }
        out.extend_from_slice(ip);
        out.extend_from_slice(b"\r\n");
        super::h1::header(out, b"x-forwarded-proto", self.proto.as_bytes());
        if let Some(h) = &self.host {
            super::h1::header(out, b"x-forwarded-host", h.as_bytes());
        }
        out.extend_from_slice(b"forwarded: ");
        let named = self
            .host
            .as_ref()
            .filter(|h| h.to_str().is_ok())
            .map(HeaderValue::as_bytes);
        forwarded_element(out, peer, ip, self.proto, named);
        out.extend_from_slice(b"\r\n");
    }
}

/// The `Forwarded` element (RFC 7239) of a request from `peer` (its
/// address as text in `ip`) over `proto`: `for=...;proto=...`, and
/// `;host="..."` for a `host` without a quote in it.
pub(super) fn forwarded_element(
    out: &mut Vec<u8>,
    peer: IpAddr,
    ip: &[u8],
    proto: &str,
    host: Option<&[u8]>,
) {
    out.extend_from_slice(b"for=");
    match peer {
        IpAddr::V4(_) => out.extend_from_slice(ip),
        IpAddr::V6(_) => {
            out.extend_from_slice(b"\"[");
            out.extend_from_slice(ip);
            out.extend_from_slice(b"]\"");
        }
    }
    out.extend_from_slice(b";proto=");
    out.extend_from_slice(proto.as_bytes());
    if let Some(host) = host.filter(|h| !h.contains(&b'"')) {
        out.extend_from_slice(b";host=\"");
        out.extend_from_slice(host);
        out.push(b'"');
    }
}

/// `ip` as text in `buf`: an IPv4 address's digits written by hand, an
/// IPv6 one (at most 45 characters) by its `Display`.
pub(super) fn ip_text(ip: IpAddr, buf: &mut [u8; 64]) -> &[u8] {
    match ip {
        IpAddr::V4(v4) => {
            let mut n = 0;
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    buf[n] = b'.';
                    n += 1;
                }
                let mut digits = itoa::Buffer::new();
                let d = digits.format(octet).as_bytes();
                buf[n..n + d.len()].copy_from_slice(d);
                n += d.len();
            }
            &buf[..n]
        }
        IpAddr::V6(_) => {
            use std::io::Write;
            let mut cursor = std::io::Cursor::new(&mut buf[..]);
            let _ = write!(cursor, "{ip}");
            let n = usize::try_from(cursor.position()).unwrap_or(0);
            &buf[..n]
        }
    }
}

/// Sends `req` to `client`'s upstream: the head must
/// come within `timeout`, the bodies stream both ways. With `idle`, the
/// answer's body fails once no frame has come for that long: a guarded
/// route's layer then records what it has (the status, without the body)
/// instead of waiting, and holding its key, for a backend that stalls.
///
/// # Errors
/// [`Failure::Unavailable`] when nothing reached the backend,
/// [`Failure::Timeout`] when the outcome is unknown.
pub(crate) async fn forward(
    client: &Client,
    timeout: Duration,
    idle: Option<Duration>,
    mut req: Request<Body>,
) -> Result<Response<Body>, Failure> {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let uri = client
        .to
        .uri(req.uri().path_and_query())
        .ok_or(Failure::Unavailable)?;
    // The target's authority wins over `Host` (RFC 9112 §3.2.2: an
    // absolute-form target's, and HTTP/2's `:authority`); else `Host` as
    // the client sent it.
    let host = match req.uri().authority() {
        Some(a) => HeaderValue::from_str(a.as_str()).ok(),
        None => req.headers().get(header::HOST).cloned(),
    };
    let proto = if req.extensions().get::<Secure>().is_some() {
        "https"
    } else {
        "http"
    };
    // An HTTP/1.1 upgrade keeps its `Upgrade` (the one hop-by-hop header
    // the backend must see to answer 101), and the client's side of the
    // connection is taken once the answer is sent.
    let upgrade = upgrade_asked(&req);
    let client_side = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
    *req.uri_mut() = uri;
    *req.version_mut() = Version::HTTP_11;
    let forwarding = Forwarding {
        peer,
        host,
        authority: client.to.authority.clone(),
        proto,
    };
    // Applied to the map now for an upgrade (hyper's, with its own
    // hop-by-hop headers put back); else by whichever way the request goes.
    let forwarding = match upgrade.clone() {
        Some(protocol) => {
            let headers = req.headers_mut();
            forwarding.apply(headers);
            headers.insert(header::UPGRADE, protocol);
            headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            None
        }
        None => Some(forwarding),
    };
    // The upstream's `timeout` counts from the request's last body byte (or
    // its start): a slow upload is the client's time, not the backend's
    // (each of its pauses is bounded by `limits.body_timeout`).
    // A request without a body (most GETs), or with one already whole in
    // memory, has nothing to watch: its `timeout` counts from now.
    let streams = !http_body::Body::is_end_stream(req.body())
        && req.extensions().get::<BodyInHand>().is_none();
    let sent = streams.then(|| std::sync::Arc::new(Sent::new()));
    let res = match &sent {
        Some(sent) => {
            let req = req.map(|inner| {
                Body::new(Watched {
                    inner,
                    sent: std::sync::Arc::clone(sent),
                })
            });
            tokio::select! {
                res = client.send(req, forwarding.as_ref()) => res,
                () = sent.quiet_for(timeout) => return Err(Failure::Timeout),
            }
        }
        None => match tokio::time::timeout(timeout, client.send(req, forwarding.as_ref())).await {
            Ok(res) => res,
            Err(_) => return Err(Failure::Timeout),
        },
    };
    let broke = || {
        sent.as_ref()
            .is_some_and(|s| s.broke.load(std::sync::atomic::Ordering::Acquire))
    };
    let res = match res {
        Err(SendError::Connect) => return Err(Failure::Unavailable),
        Err(SendError::Switched) => return Err(Failure::Switched),
        Err(SendError::Request(_)) if broke() => return Err(Failure::ClientBody),
        Err(SendError::Request(e)) => {
            tracing::debug!(error = %e, "no answer from the upstream");
            return Err(Failure::Timeout);
        }
        Ok(res) => res,
    };
    if res.status() == http::StatusCode::SWITCHING_PROTOCOLS {
        // Only to the protocol asked for (one the file's `upgrades`
        // allows, `route_request` saw to that): any other switch would
        // join the client to a channel no guard reads (h2c).
        return match (client_side, upgrade) {
            (Some(client_side), Some(asked)) if switched_to_asked(&asked, &res) => {
                Ok(spliced(client_side, res))
            }
            _ => Err(Failure::Switched),
        };
    }
    let (mut parts, body) = res.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let body = match idle {
        Some(idle) => Body::new(tower_http::timeout::TimeoutBody::new(idle, body)),
        None => body,
    };
    Ok(Response::from_parts(parts, body))
}

/// The protocol a request asks to switch to: an HTTP/1.1 request with
/// `Upgrade` whose `Connection` names `upgrade` (RFC 9110 §7.8).
pub(crate) fn upgrade_asked<B>(req: &Request<B>) -> Option<HeaderValue> {
    if req.version() != Version::HTTP_11 {
        return None;
    }
    let named = req
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    named
        .then(|| req.headers().get(header::UPGRADE).cloned())
        .flatten()
}

/// Whether the 101 `res` switches to a protocol of `asked` (the request's
/// `Upgrade` list), by name: `websocket` asked, `WebSocket` answered.
fn switched_to_asked(asked: &HeaderValue, res: &Response<Body>) -> bool {
    let name = |p: &str| {
        p.split('/')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase()
    };
    let Some(to) = res
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .map(name)
    else {
        return false;
    };
    asked
        .to_str()
        .is_ok_and(|a| a.split(',').any(|p| name(p) == to))
}

/// The upstream's 101 passed to the client (its hop-by-hop headers
/// dropped but `Upgrade` and `Connection: upgrade`), and both connections
/// spliced once each side is handed over: bytes are copied both ways
/// until either side closes. The client's side is held to
/// `limits.idle_timeout` without a byte either way (see `connection`).
fn spliced(client_side: hyper::upgrade::OnUpgrade, mut res: Response<Body>) -> Response<Body> {
    let upstream_side = hyper::upgrade::on(&mut res);
    let (mut parts, _) = res.into_parts();
    let protocol = parts.headers.get(header::UPGRADE).cloned();
    strip_hop_by_hop(&mut parts.headers);
    if let Some(p) = protocol {
        parts.headers.insert(header::UPGRADE, p);
    }
    parts
        .headers
        .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    tokio::spawn(async move {
        let (Ok(client), Ok(upstream)) = tokio::join!(client_side, upstream_side) else {
            return;
        };
        let (mut client, mut upstream) = (TokioIo::new(client), TokioIo::new(upstream));
        if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
            tracing::debug!(error = %e, "upgraded connection ended");
        }
    });
    Response::from_parts(parts, Body::empty())
}

/// The answer's body of an idempotency route, read ahead up to `cap` bytes
/// before the answer goes on to the layer, so that a body that breaks (the
/// backend closed the connection half-way, or sent nothing for the route's
/// `timeout`) is told apart from a whole one while the outcome can still
/// be recorded as unknown: `Err(Broken)`, answered 504. A body announced
/// over `cap` is not read (it is streamed, and recorded without it); one
/// that grows past `cap` goes on as what was read, then the rest, streamed.
///
/// # Errors
/// [`Broken`] when the body failed before its end or before `cap` bytes.
pub(crate) async fn read_ahead(mut body: Body, cap: usize) -> Result<Body, Broken> {
    let cap = cap as u64;
    if http_body::Body::size_hint(&body).lower() > cap {
        return Ok(body);
    }
    let mut frames = VecDeque::new();
    let mut buffered = 0u64;
    loop {
        let next =
            std::future::poll_fn(|cx| http_body::Body::poll_frame(Pin::new(&mut body), cx)).await;
        match next {
            None => {
                return Ok(Body::new(ReadAhead {
                    frames,
                    buffered,
                    rest: None,
                }));
            }
            Some(Err(_)) => return Err(Broken),
            Some(Ok(frame)) => {
                buffered += frame.data_ref().map_or(0, |d| d.len() as u64);
                frames.push_back(frame);
                if buffered > cap {
                    return Ok(Body::new(ReadAhead {
                        frames,
                        buffered,
                        rest: Some(body),
                    }));
                }
            }
        }
    }
}

/// An answer's body broke before its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Broken;

/// The frames [`read_ahead`] read, then the rest of the body, if any.
struct ReadAhead {
    frames: VecDeque<Frame<Bytes>>,
    /// The data bytes still in `frames`.
    buffered: u64,
    rest: Option<Body>,
}

impl http_body::Body for ReadAhead {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(frame) = self.frames.pop_front() {
            let n = frame.data_ref().map_or(0, |d| d.len() as u64);
            self.buffered -= n;
            return Poll::Ready(Some(Ok(frame)));
        }
        match self.rest.as_mut() {
            Some(rest) => http_body::Body::poll_frame(Pin::new(rest), cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty()
            && self
                .rest
                .as_ref()
                .is_none_or(http_body::Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        match &self.rest {
            None => SizeHint::with_exact(self.buffered),
            Some(rest) => {
                let h = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(h.lower() + self.buffered);
                if let Some(upper) = h.upper() {
                    hint.set_upper(upper + self.buffered);
                }
                hint
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{
        Broken, HOP_BY_HOP, InHand, ReadAhead, add_forwarded, connect_timeout, hop_by_hop_index,
        in_hand, read_ahead, strip_hop_by_hop,
    };
    use http::{HeaderMap, HeaderValue};

    /// The lines written by hand are those of the map as `apply` leaves it
    /// (in another order), for every kind of request: forwarding headers
    /// of earlier proxies, several of each, a `Connection` naming others,
    /// no `Host`, a `Host` no `Forwarded` may name, no peer.
    #[test]
    fn forwarding_written_by_hand_is_the_maps_after_apply() {
        let requests: [&[(&'static str, &'static str)]; 5] = [
            &[
                ("host", "shop.example"),
                ("content-type", "application/json"),
                ("content-length", "7"),
            ],
            &[
                ("host", "shop.example"),
                ("x-forwarded-for", "10.0.0.1"),
                ("x-forwarded-for", "10.0.0.2, 10.0.0.3"),
                ("x-forwarded-proto", "https"),
                ("x-forwarded-host", "edge.example"),
                ("forwarded", "for=10.0.0.1"),
                ("x-user-id", "u1"),
                ("x-user-id", "u2"),
            ],
            &[
                ("host", "shop.example"),
                ("connection", "keep-alive, x-secret"),
                ("x-secret", "1"),
                ("keep-alive", "timeout=5"),
                ("te", "trailers"),
                ("upgrade", "h2c"),
                ("x-kept", "yes"),
            ],
            &[("accept", "*/*"), ("x-forwarded-host", "edge.example")],
            &[("host", "a\"b.example"), ("proxy-connection", "keep-alive")],
        ];
        let peers = [
            Some("192.0.2.7".parse().unwrap()),
            Some("2001:db8::1".parse().unwrap()),
            None,
        ];
        for pairs in requests {
            for peer in peers {
                let map = headers(pairs);
                let forwarding = super::Forwarding {
                    peer,
                    host: map.get(http::header::HOST).cloned(),
                    authority: http::uri::Authority::from_static("127.0.0.1:9000"),
                    proto: "http",
                };
                let mut applied = map.clone();
                forwarding.apply(&mut applied);
                let mut want: Vec<String> = applied
                    .iter()
                    .filter(|(n, _)| *n != http::header::CONTENT_LENGTH)
                    .map(|(n, v)| format!("{}: {}", n, String::from_utf8_lossy(v.as_bytes())))
                    .collect();
                let mut out = Vec::new();
                forwarding.write(&mut map.clone(), &mut out);
                let text = String::from_utf8(out).unwrap();
                let mut got: Vec<String> =
                    text.split_terminator("\r\n").map(str::to_owned).collect();
                want.sort();
                got.sort();
                assert_eq!(got, want, "{pairs:?} from {peer:?}");
            }
        }
    }

    /// The names told by their text, in any case, are the list's, in its
    /// order, and no other.
    #[test]
    fn hop_by_hop_names_are_told_by_their_text() {
        for (i, name) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_by_hop_index(name.as_str()), Some(i), "{name}");
            let upper = name.as_str().to_ascii_uppercase();
            assert_eq!(hop_by_hop_index(&upper), Some(i), "{upper}");
        }
        for other in [
            "host",
            "content-length",
            "t",
            "tee",
            "upgrades",
            "keep_alive",
        ] {
            assert_eq!(hop_by_hop_index(other), None, "{other}");
        }
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    /// Every hop-by-hop header goes, in any case, and every name
    /// `Connection` lists (over two fields), `close` too when a header is
    /// called so; the others stay.
    #[test]
    fn hop_by_hop_headers_are_dropped_and_the_rest_kept() {
        let mut h = headers(&[
            ("connection", "Keep-Alive, X-Secret"),
            ("connection", "close, TE"),
            ("keep-alive", "timeout=5"),
            ("x-secret", "1"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("proxy-connection", "keep-alive"),
            ("trailer", "x-sum"),
            ("close", "a header named close"),
            ("x-kept", "1"),
            ("content-type", "text/plain"),
        ]);
        strip_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(http::HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-type", "x-kept"]);

        // Nothing hop-by-hop: nothing changes.
        let mut h = headers(&[("host", "x"), ("x-close", "1")]);
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 2);
        // `close` names no header when none is called so.
        let mut h = headers(&[("connection", "close"), ("x-kept", "1")]);
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
    }

    /// The forwarded headers, written without `format!`, are what they
    /// were: the peer appended to a client's `X-Forwarded-For`, an IPv6
    /// node quoted in brackets, a host with a quote left out of
    /// `Forwarded` (it would break the field) but still in
    /// `X-Forwarded-Host`.
    #[test]
    fn forwarded_headers_name_the_peer_its_protocol_and_the_host() {
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", HeaderValue::from_static("1.2.3.4"));
        h.append("x-forwarded-for", HeaderValue::from_static("5.6.7.8"));
        let ip = "203.0.113.255".parse().unwrap();
        add_forwarded(
            &mut h,
            Some(ip),
            Some(HeaderValue::from_static("shop.example")),
            "https",
        );
        assert_eq!(h["x-forwarded-for"], "1.2.3.4, 5.6.7.8, 203.0.113.255");
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(h["x-forwarded-host"], "shop.example");
        assert_eq!(
            h["forwarded"],
            "for=203.0.113.255;proto=https;host=\"shop.example\""
        );

        let mut h = HeaderMap::new();
        h.append("forwarded", HeaderValue::from_static("for=1.1.1.1"));
        let ip = "2001:db8::1".parse().unwrap();
        add_forwarded(
            &mut h,
            Some(ip),
            Some(HeaderValue::from_static("a\"b")),
            "http",
        );
        assert_eq!(h["x-forwarded-for"], "2001:db8::1");
        let forwarded: Vec<_> = h.get_all("forwarded").iter().collect();
        assert_eq!(
            forwarded,
            ["for=1.1.1.1", "for=\"[2001:db8::1]\";proto=http"]
        );
        assert_eq!(h["x-forwarded-host"], "a\"b");

        let mut h = HeaderMap::new();
        add_forwarded(&mut h, Some("0.0.0.0".parse().unwrap()), None, "http");
        assert_eq!(h["x-forwarded-for"], "0.0.0.0");
        assert_eq!(h["forwarded"], "for=0.0.0.0;proto=http");
        assert!(h.get("x-forwarded-host").is_none());
    }
    use axum::body::Body;
    use bytes::Bytes;

    /// A body of these frames in turn (`Err`: the body fails there).
    struct Frames(std::vec::IntoIter<Result<&'static str, &'static str>>);

    impl http_body::Body for Frames {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
            std::task::Poll::Ready(self.0.next().map(|r| {
                r.map(|s| http_body::Frame::data(Bytes::from_static(s.as_bytes())))
                    .map_err(std::io::Error::other)
            }))
        }
    }

    fn chunks(parts: Vec<Result<&'static str, &'static str>>) -> Body {
        Body::new(Frames(parts.into_iter()))
    }

    async fn text(body: Body) -> Result<String, axum::Error> {
        let bytes = axum::body::to_bytes(body, usize::MAX).await?;
        Ok(String::from_utf8(bytes.to_vec()).unwrap_or_default())
    }

    #[test]
    fn a_body_with_its_first_bytes_put_back_is_as_long_as_it_was() {
        let body = ReadAhead {
            frames: [http_body::Frame::data(Bytes::from_static(b"hello"))].into(),
            buffered: 5,
            rest: Some(Body::from(" world")),
        };
        let hint = http_body::Body::size_hint(&body);
        assert_eq!(hint.exact(), Some(11));
    }

    #[tokio::test]
    async fn a_body_put_back_yields_its_first_bytes_then_the_rest() {
        let body = Body::new(ReadAhead {
            frames: [http_body::Frame::data(Bytes::from_static(b"hello"))].into(),
            buffered: 5,
            rest: Some(Body::from(" world")),
        });
        assert_eq!(text(body).await.unwrap(), "hello world");
    }

    #[tokio::test]
    async fn a_whole_body_is_read_ahead_and_a_broken_one_is_told() {
        let whole = read_ahead(chunks(vec![Ok("ab"), Ok("cd")]), 10)
            .await
            .unwrap();
        assert_eq!(http_body::Body::size_hint(&whole).exact(), Some(4));
        assert_eq!(text(whole).await.unwrap(), "abcd");
        let broken = read_ahead(chunks(vec![Ok("ab"), Err("reset")]), 10).await;
        assert_eq!(broken.err(), Some(Broken));
        // Past the cap: what was read, then the rest as it comes (a break
        // there is the client's to see).
        let long = read_ahead(chunks(vec![Ok("abc"), Ok("def"), Ok("g")]), 4)
            .await
            .unwrap();
        assert_eq!(text(long).await.unwrap(), "abcdefg");
        let late = read_ahead(chunks(vec![Ok("abcde"), Err("reset")]), 4)
            .await
            .unwrap();
        assert!(text(late).await.is_err());
    }
    /// A body of `ready` frames, then not ready once, then `later`'s.
    struct Paused {
        ready: std::vec::IntoIter<&'static str>,
        paused: bool,
        later: std::vec::IntoIter<&'static str>,
    }

    impl http_body::Body for Paused {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
            let frame = |s: &'static str| {
                Some(Ok(http_body::Frame::data(Bytes::from_static(s.as_bytes()))))
            };
            if let Some(s) = self.ready.next() {
                return std::task::Poll::Ready(frame(s));
            }
            if !self.paused {
                self.paused = true;
                cx.waker().wake_by_ref();
                return std::task::Poll::Pending;
            }
            std::task::Poll::Ready(self.later.next().and_then(frame))
        }
    }

    /// A body whose frames are all ready is taken whole (one frame as it
    /// is, several joined); one that breaks is told; one still coming
    /// streams on, what was taken first.
    #[tokio::test]
    async fn a_body_ready_at_once_is_in_hand_one_still_coming_streams_on() {
        let whole = |got: InHand| match got {
            InHand::Whole(b) => b,
            InHand::Broke(e) => panic!("broke: {e}"),
            InHand::Streaming(_) => panic!("streaming"),
        };
        assert_eq!(whole(in_hand(chunks(vec![Ok("abc")])).await), "abc");
        assert_eq!(
            whole(in_hand(chunks(vec![Ok("ab"), Ok("cd")])).await),
            "abcd"
        );
        assert_eq!(whole(in_hand(chunks(vec![])).await), "");
        assert_eq!(whole(in_hand(Body::from("whole")).await), "whole");
        assert!(matches!(
            in_hand(chunks(vec![Ok("ab"), Err("reset")])).await,
            InHand::Broke(_)
        ));
        let paused = Body::new(Paused {
            ready: vec!["ab", "cd"].into_iter(),
            paused: false,
            later: vec!["ef"].into_iter(),
        });
        let InHand::Streaming(rest) = in_hand(paused).await else {
            panic!("a body still coming was taken as whole or broken");
        };
        assert_eq!(text(rest).await.unwrap(), "abcdef");
    }

    use std::time::Duration;

    /// A connection attempt gives up before the route's timeout, so a
    /// backend that never accepts is a 502 (nothing reached it), never a
    /// 504 whose unknown outcome would lock the key for its retention.
    #[test]
    fn a_connection_attempt_ends_before_the_routes_timeout() {
        for ms in [1, 500, 2_000, 9_999, 30_000, 3_600_000] {
            let timeout = Duration::from_millis(ms);
            let connect = connect_timeout(timeout);
            assert!(connect < timeout, "{connect:?} for {timeout:?}");
            assert!(connect <= Duration::from_secs(5));
        }
        assert_eq!(
            connect_timeout(Duration::from_secs(2)),
            Duration::from_secs(1)
        );
    }
}
