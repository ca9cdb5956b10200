// Over 400 lines on purpose: one pool of upstream connections, hyper's and plain, with the bodies that give a connection back at their end; each half needs the other's internals.
//! The upstream's connections: HTTP/1.1 connections pooled per worker and
//! per route ([`Client`]), a request sent on them by hand
//! ([`super::exchange`]) when its body is in hand, by hyper's client
//! otherwise; an `https://` upstream over rustls.

use super::ReadAhead;
use super::headers::Forwarding;
use axum::body::Body;
use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{Request, Response, Uri, header};
use http_body::{Frame, SizeHint};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use std::collections::VecDeque;
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
        Some(crate::serve::tls::client_config(ca, https));
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
    std::sync::Arc::new(crate::serve::workers::PerWorker::new(|| {
        Client::new(connect, to.clone())
    }))
}

/// The upstream clients of a route (or of the pass-through), one per
/// worker: a request uses its worker's ([`crate::serve::workers::PerWorker::get`]).
pub(crate) type Pool = std::sync::Arc<crate::serve::workers::PerWorker<Client>>;

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
    pub(super) to: Target,
    idle: std::sync::Arc<std::sync::Mutex<VecDeque<Idle>>>,
    /// Plain sockets spoken HTTP/1.1 on by hand (`upstream/exchange.rs`: the lane's,
    /// and a route's request whose body is in hand), kept as hyper's are.
    raw: std::sync::Arc<RawPool>,
    /// Gives a connection back to `raw` (what an answer's body calls at
    /// its end).
    give_back: crate::serve::upstream::exchange::Idle,
    connect: Duration,
}

/// A connection waiting for its next request, since when.
struct Parked<C> {
    conn: C,
    since: std::time::Instant,
}

/// A hyper client connection waiting.
type Idle = Parked<hyper::client::conn::http1::SendRequest<Body>>;
/// A plain connection waiting (`upstream/exchange.rs`).
type RawIdle = Parked<tokio::net::TcpStream>;

/// The plain idle connections (`upstream/exchange.rs`, the pass-through's lane). No task
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
pub(super) enum SendError {
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
            .get_or_insert_with(|| crate::serve::tls::client_config(None, false))
            .clone();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(std::sync::Arc::unwrap_or_clone(tls))
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        let raw: std::sync::Arc<RawPool> = std::sync::Arc::default();
        let give_back: crate::serve::upstream::exchange::Idle = {
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
        // One buffer per write, as on the client's side (`listen/connection.rs`).
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
    /// route's) is written by hand (`upstream/exchange.rs`); the others, an upgrade, a
    /// streaming upload, an `https://` upstream, by hyper's client.
    /// `forwarding`: the gateway's headers, not yet applied (none for an
    /// upgrade, hyper's, whose headers are already).
    pub(super) async fn send(
        &self,
        mut req: Request<Body>,
        forwarding: Option<&Forwarding>,
    ) -> Result<Response<Body>, SendError> {
        let by_hand = forwarding.filter(|_| {
            self.is_plain()
                && !req.headers().contains_key(header::UPGRADE)
                && crate::serve::upstream::exchange::body_in_hand(&req)
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
        crate::serve::upstream::exchange::exchange(
            self.take_raw(),
            || self.connect_raw(),
            (parts, forwarding),
            target.as_bytes(),
            body,
            std::sync::Arc::clone(&self.give_back),
        )
        .await
        .map_err(|e| match e {
            crate::serve::upstream::exchange::Failed::Unavailable => SendError::Connect,
            crate::serve::upstream::exchange::Failed::Unknown(e) => SendError::Request(Box::new(e)),
            crate::serve::upstream::exchange::Failed::Switched => SendError::Switched,
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
pub(super) enum InHand {
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
pub(super) async fn in_hand(mut body: Body) -> InHand {
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
    pub(super) authority: http::uri::Authority,
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
    pub(super) fn uri(&self, pq: Option<&PathAndQuery>) -> Option<Uri> {
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
