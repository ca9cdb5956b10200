// Over 400 lines on purpose: one pool of upstream connections, hyper's and plain, with the bodies that give a connection back at their end, and the client that spreads requests over the servers; each part needs the others' internals.
//! The upstream's connections: HTTP/1.1 connections pooled per worker and
//! per route ([`Client`]), a request sent on them by hand
//! ([`super::exchange`]) when its body is in hand, by hyper's client
//! otherwise; an `https://` upstream over rustls.

use super::ReadAhead;
use super::balance::{self, Health, Lease};
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

/// One client of `upstream`'s servers per worker (see `workers.rs`), each
/// with its own idle connections, giving up on a connection attempt after
/// `connect`.
#[must_use]
pub(crate) fn client(connect: Duration, upstream: &crate::config::Upstream) -> Pool {
    let targets: Vec<Target> = upstream.servers().map(Target::new).collect();
    // One server: no choice to make, nothing to count.
    let health: std::sync::Arc<[std::sync::Arc<Health>]> = if targets.len() > 1 {
        upstream
            .servers()
            .zip(&targets)
            .map(|(u, t)| balance::health(u.as_str(), |path| probe(t, path)))
            .collect()
    } else {
        std::sync::Arc::new([])
    };
    std::sync::Arc::new(crate::serve::workers::PerWorker::new(|| Client {
        to: targets[0].clone(),
        servers: targets
            .iter()
            .map(|t| Server::new(connect, t.clone()))
            .collect(),
        health: std::sync::Arc::clone(&health),
        turn: std::sync::atomic::AtomicUsize::new(0),
    }))
}

/// A health check of `to`: `GET path`, passed by a 2xx within the time.
fn probe(to: &Target, path: &str) -> balance::Probe {
    let uri = to.uri(path.parse::<PathAndQuery>().ok().as_ref());
    let server = std::sync::Arc::new(Server::new(MAX_CONNECT, to.clone()));
    let authority = to.authority.clone();
    std::sync::Arc::new(move |within| {
        let server = std::sync::Arc::clone(&server);
        let uri = uri.clone();
        let authority = authority.clone();
        Box::pin(async move {
            let Some(uri) = uri else { return false };
            let Ok(host) = http::HeaderValue::from_str(authority.as_str()) else {
                return false;
            };
            let mut req = Request::new(Body::empty());
            *req.uri_mut() = uri;
            req.headers_mut().insert(header::HOST, host);
            let answer = tokio::time::timeout(within, async {
                let res = server.send_by_hyper(req).await.ok()?;
                let ok = res.status().is_success();
                // Read whole, so the connection is kept for the next check.
                let _ = axum::body::to_bytes(res.into_body(), 64 * 1024).await;
                Some(ok)
            })
            .await;
            matches!(answer, Ok(Some(true)))
        })
    })
}

/// The upstream clients of a route (or of the pass-through), one per
/// worker: a request uses its worker's ([`crate::serve::workers::PerWorker::get`]).
pub(crate) type Pool = std::sync::Arc<crate::serve::workers::PerWorker<Client>>;

/// How long an idle upstream connection is kept for a next request.
const IDLE_FOR: Duration = Duration::from_secs(30);

/// The most idle connections a client keeps (the ones past it close).
const MAX_IDLE: usize = 1024;

/// The servers of one route's upstream (or of the pass-through's) on one
/// worker: a request goes to one chosen by [`balance::pick`], and to
/// another only when it reached none of it (`upstream/balance.rs`).
pub(crate) struct Client {
    /// The first server's URL: the base path (the same for all) and the
    /// authority of a request that names none.
    pub(super) to: Target,
    servers: Box<[Server]>,
    /// Each server's state, shared by every worker (none for one server).
    health: std::sync::Arc<[std::sync::Arc<Health>]>,
    /// The picks made, for ties in turn.
    turn: std::sync::atomic::AtomicUsize,
}

/// The HTTP/1.1 connections of one upstream server on one worker: made when none is idle, kept while idle
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
pub(crate) struct Server {
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

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}

/// Why [`Server::send`] has no answer.
enum Unsent {
    /// Nothing of it reached the server (no connection): the request
    /// back, with whether the forwarding headers are already in it.
    Refused(Box<Request<Body>>, bool),
    Failed(SendError),
}

impl From<SendError> for Unsent {
    fn from(e: SendError) -> Self {
        Unsent::Failed(e)
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
    /// Whether every server is spoken to in the clear (`http://`): the
    /// pass-through's lane takes only those.
    pub(crate) fn is_plain(&self) -> bool {
        self.servers.iter().all(Server::is_plain)
    }

    /// The upstream's base path (`/base`), none for `/`.
    pub(crate) fn base(&self) -> Option<&str> {
        self.to.base.as_deref()
    }

    /// The server a request goes to first (the lane's way in: it then
    /// takes a connection from the pick).
    pub(crate) fn pick(&self) -> Pick<'_> {
        let at = if self.health.is_empty() {
            0
        } else {
            balance::pick(&self.health, &self.turn, 0).unwrap_or(0)
        };
        Pick {
            client: self,
            at,
            tried: 1 << at,
            lease: self.health.get(at).map(Lease::new),
        }
    }

    /// Sends `req` to one server, and to the next when nothing of it
    /// reached that one (see [`Server::send`]).
    pub(super) async fn send(
        &self,
        mut req: Request<Body>,
        forwarding: Option<&Forwarding>,
    ) -> Result<Response<Body>, SendError> {
        if self.health.is_empty() {
            return match self.servers[0].send(req, forwarding, false).await {
                Ok(res) => Ok(res),
                Err(Unsent::Refused(..)) => Err(SendError::Connect),
                Err(Unsent::Failed(e)) => Err(e),
            };
        }
        let mut pick = self.pick();
        let mut forwarding = forwarding;
        loop {
            let server = &self.servers[pick.at];
            // The chosen server's authority for a request that names none.
            let own = forwarding.map(|f| Forwarding {
                peer: f.peer,
                host: f.host.clone(),
                authority: server.to.authority.clone(),
                proto: f.proto,
            });
            match server.send(req, own.as_ref(), true).await {
                Err(Unsent::Refused(back, applied)) => {
                    self.health[pick.at].refused();
                    if !pick.next() {
                        return Err(SendError::Connect);
                    }
                    req = *back;
                    if applied {
                        forwarding = None;
                    }
                }
                Err(Unsent::Failed(e)) => {
                    self.health[pick.at].reached();
                    return Err(e);
                }
                Ok(res) => {
                    self.health[pick.at].reached();
                    // Outstanding until its answer's body has ended.
                    let lease = pick.lease.take();
                    return Ok(res.map(|body| Body::new(Leased { body, lease })));
                }
            }
        }
    }
}

/// An answer's body that holds its request's [`Lease`] until the server's
/// answer is read to its end (or given up), not until the client has it:
/// the server is done with the request then. Before, the lease went when
/// the body was dropped, after its last bytes were written to the client,
/// and a client that sent its next request at once could find the server
/// it had just left still counted busy (a fresh-clone run under load
/// failed `backends::a_busy_server_gets_no_more_until_it_answers` so).
struct Leased {
    body: Body,
    #[allow(dead_code)] // Held for its `Drop`: one request fewer outstanding.
    lease: Option<Lease>,
}

impl http_body::Body for Leased {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let frame = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(frame, Poll::Ready(None)) || self.body.is_end_stream() {
            self.lease = None;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The server a request goes to, held (as one outstanding) until dropped.
pub(crate) struct Pick<'a> {
    client: &'a Client,
    at: usize,
    /// The servers it went to, one bit each.
    tried: u64,
    #[allow(dead_code)] // Held for its `Drop`: one request fewer outstanding.
    lease: Option<Lease>,
}

impl Pick<'_> {
    /// Moves on to a server not tried yet: `false` when there is none.
    fn next(&mut self) -> bool {
        let Some(at) = balance::pick(&self.client.health, &self.client.turn, self.tried) else {
            return false;
        };
        self.at = at;
        self.tried |= 1 << at;
        self.lease = Some(Lease::new(&self.client.health[at]));
        true
    }

    /// The server's most recently idle plain connection still open
    /// ([`Server::take_raw`]).
    pub(crate) fn take_raw(&self) -> Option<tokio::net::TcpStream> {
        self.client.servers[self.at].take_raw()
    }

    /// A new plain connection: to the server picked, else (it refused) to
    /// the next one, and so on; the last one's error when none connects.
    pub(crate) async fn connect_raw(&mut self) -> std::io::Result<tokio::net::TcpStream> {
        loop {
            match self.client.servers[self.at].connect_raw().await {
                Ok(up) => {
                    if let Some(h) = self.client.health.get(self.at) {
                        h.reached();
                    }
                    return Ok(up);
                }
                Err(e) => {
                    let Some(h) = self.client.health.get(self.at) else {
                        return Err(e);
                    };
                    h.refused();
                    if !self.next() {
                        return Err(e);
                    }
                }
            }
        }
    }

    /// The server's answer is read to its end: the request is no longer
    /// outstanding there, before its last bytes are written to the client
    /// (as [`Leased`] does on hyper's path). Held until the pick was
    /// dropped, after that write, the lease outlived the answer by a
    /// moment in which the client's next request, taken by another
    /// worker, found the server it had just left still counted busy.
    pub(crate) fn answered(&mut self) {
        self.lease = None;
    }

    /// Keeps `stream`, of the server picked, for a next request.
    pub(crate) fn put_raw(&self, stream: tokio::net::TcpStream) {
        self.client.servers[self.at].put_raw(stream);
    }
}

impl Server {
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

    /// Whether the server is spoken to in the clear (`http://`).
    fn is_plain(&self) -> bool {
        self.to.origin.scheme() == Some(&http::uri::Scheme::HTTP)
    }

    /// The most recently idle plain connection that is still open: one
    /// whose socket has nothing to read (a backend that closed it, or
    /// wrote out of turn, leaves it readable). The check is the reactor's
    /// readiness first: usually no system call when nothing came. A close
    /// that the reactor has not seen yet is missed (as by hyper's pool):
    /// the request then meets it, and is answered 504, never sent again.
    fn take_raw(&self) -> Option<tokio::net::TcpStream> {
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
    fn put_raw(&self, stream: tokio::net::TcpStream) {
        self.raw.park(stream);
    }

    /// A new plain connection to the upstream, within the client's
    /// connection timeout.
    async fn connect_raw(&self) -> std::io::Result<tokio::net::TcpStream> {
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
    /// upgrade, hyper's, whose headers are already). `again`: another
    /// server may take the request when this one refuses it (it is kept
    /// for that: [`Unsent::Refused`]).
    async fn send(
        &self,
        mut req: Request<Body>,
        forwarding: Option<&Forwarding>,
        again: bool,
    ) -> Result<Response<Body>, Unsent> {
        let by_hand = forwarding.filter(|_| {
            self.is_plain()
                && !req.headers().contains_key(header::UPGRADE)
                && crate::serve::upstream::exchange::body_in_hand(&req)
        });
        let Some(forwarding) = by_hand else {
            let applied = forwarding.is_some();
            if let Some(f) = forwarding {
                f.apply(req.headers_mut());
            }
            return self
                .send_by_hyper(req)
                .await
                .map_err(|e| e.applied(applied));
        };
        let (mut parts, body) = req.into_parts();
        let body = match in_hand(body).await {
            InHand::Whole(bytes) => bytes,
            InHand::Broke(e) => return Err(SendError::Request(e).into()),
            InHand::Streaming(body) => {
                forwarding.apply(&mut parts.headers);
                return self
                    .send_by_hyper(Request::from_parts(parts, body))
                    .await
                    .map_err(|e| e.applied(true));
            }
        };
        // What a refused request is sent again from (only where another
        // server may take it: a copy of the head per request).
        let kept = again.then(|| {
            let mut head = Request::new(());
            *head.method_mut() = parts.method.clone();
            *head.uri_mut() = parts.uri.clone();
            *head.headers_mut() = parts.headers.clone();
            (head, body.clone())
        });
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
            crate::serve::upstream::exchange::Failed::Unavailable => match kept {
                Some((head, body)) => {
                    Unsent::Refused(Box::new(head.map(|()| Body::from(body))), false)
                }
                None => SendError::Connect.into(),
            },
            crate::serve::upstream::exchange::Failed::Unknown(e) => {
                SendError::Request(Box::new(e)).into()
            }
            crate::serve::upstream::exchange::Failed::Switched => SendError::Switched.into(),
        })
    }

    /// [`Server::send`] by hyper's client connections. `Err(Ok(req))`:
    /// nothing of `req` reached the server.
    async fn send_by_hyper(
        &self,
        mut req: Request<Body>,
    ) -> Result<Response<Body>, Result<Request<Body>, SendError>> {
        loop {
            let (mut send, reused) = match self.take() {
                Some(send) => (send, true),
                None => match self.connect().await {
                    Ok(send) => (send, false),
                    Err(_) => return Err(Ok(req)),
                },
            };
            // A connection given back as its answer's body ended may still
            // be finishing that answer: a moment, on this thread.
            if send.ready().await.is_err() {
                if reused {
                    continue;
                }
                return Err(Ok(req));
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
                    Some(unsent) => return Err(Ok(unsent)),
                    None => return Err(Err(SendError::Request(Box::new(e.into_error())))),
                },
            }
        }
    }
}

/// What [`Server::send_by_hyper`]'s failure is to [`Server::send`].
trait Applied {
    /// `applied`: the forwarding headers are in the request.
    fn applied(self, applied: bool) -> Unsent;
}

impl Applied for Result<Request<Body>, SendError> {
    fn applied(self, applied: bool) -> Unsent {
        match self {
            Ok(req) => Unsent::Refused(Box::new(req), applied),
            Err(e) => Unsent::Failed(e),
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
