//! A route's request on the lane (issue 39): an HTTP/1.1 request the
//! pass-through's lane (`passthrough.rs`) does not forward itself, a
//! route's or one with a body, read whole (its body up to
//! [`IN_HAND`](super::h1::IN_HAND)), built into the `Request` hyper would
//! have built from it, answered by [`dispatch`], the one implementation
//! of the refusals, the routes and their stacks, and its answer written
//! by hand ([`write_answer`]): the same request without hyper's server
//! (its dispatcher, its body channel, its answer encoder), 2-3 % fewer
//! instructions a fingerprint request (BENCHMARKS.md, issue 39).
//!
//! A body is read first only where that changes nothing: it has come with
//! the head already, or the route's guard reads it whole before anything
//! else (fingerprint, idempotency). Any other body streams through hyper,
//! as a backend may answer an upload before reading all of it. What the
//! lane leaves to hyper, it still leaves: `Transfer-Encoding`, `Expect`,
//! `Upgrade`, a body over 64 KiB, HTTP/1.0, the gateway's own routes, and
//! every request once the shutdown has begun.

use super::access::{self, Owed};
use super::answers::client_body_broke;
use super::connection::Stop;
use super::forward::BodyInHand;
use super::gateway::Gateway;
use super::h1::{unless_client_leaves, write_answer};
use super::metrics::{RouteMetrics, of_code};
use super::request::dispatch;
use axum::body::Body;
use axum::extract::ConnectInfo;
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

/// A request head the lane parsed, as places in the client's bytes.
pub(super) struct Head {
    /// The head's length.
    len: usize,
    /// The body's (`Content-Length`, 0 without one).
    length: usize,
    method: Range<usize>,
    target: Range<usize>,
    headers: Vec<(Range<usize>, Range<usize>)>,
    /// The client asked for `Connection: close`.
    close: bool,
    /// The route the lane chose for it, if any: what its own refusal
    /// (a stalled body) is counted under and named by in the access log,
    /// as `dispatch` would have.
    route: Option<Arc<RouteMetrics>>,
}

impl Head {
    /// The head of `len` bytes at the start of `buf`, whose `method`,
    /// `target` and `headers` httparse read from it.
    pub(super) fn new(
        len: usize,
        length: u64,
        (method, target): (&str, &str),
        headers: &[httparse::Header<'_>],
        (close, route): (bool, Option<Arc<RouteMetrics>>),
        buf: &[u8],
    ) -> Self {
        let at = |s: &[u8]| {
            let start = s.as_ptr() as usize - buf.as_ptr() as usize;
            start..start + s.len()
        };
        Self {
            len,
            length: usize::try_from(length).unwrap_or(usize::MAX),
            method: at(method.as_bytes()),
            target: at(target.as_bytes()),
            headers: headers
                .iter()
                .map(|h| (at(h.name.as_bytes()), at(h.value)))
                .collect(),
            close,
            route,
        }
    }

    /// The request from `bytes`, the head and its body: as hyper's server
    /// builds it (origin-form URI, HTTP/1.1, the headers as sent), with
    /// the peer's address.
    fn request(&self, bytes: &Bytes, peer: SocketAddr) -> Option<Request<Body>> {
        let method = Method::from_bytes(&bytes[self.method.clone()]).ok()?;
        let uri = Uri::from_maybe_shared(bytes.slice(self.target.clone())).ok()?;
        let mut headers = HeaderMap::with_capacity(self.headers.len());
        for (name, value) in &self.headers {
            let name = HeaderName::from_bytes(&bytes[name.clone()]).ok()?;
            let value = HeaderValue::from_maybe_shared(bytes.slice(value.clone())).ok()?;
            headers.append(name, value);
        }
        let body = match self.length {
            0 => Body::empty(),
            _ => Body::from(bytes.slice(self.len..)),
        };
        let mut req = Request::new(body);
        *req.method_mut() = method;
        *req.uri_mut() = uri;
        *req.headers_mut() = headers;
        req.extensions_mut().insert(ConnectInfo(peer));
        if self.length > 0 {
            req.extensions_mut().insert(BodyInHand);
        }
        Some(req)
    }
}

/// Serves the request whose head starts `buf`: its body read (each piece
/// within `body_timeout`), its answer from [`dispatch`] written to `io`.
/// While the answer is made the client's socket is read: a client that
/// leaves drops the request's future, as hyper's server does (its
/// access-log line says 499). `false`: the connection is to be closed.
pub(super) async fn serve<S>(
    io: &mut S,
    buf: &mut BytesMut,
    head: Head,
    (gw, peer, stop): (&Arc<Gateway>, SocketAddr, &Stop),
    body_timeout: Duration,
    out: &mut Vec<u8>,
) -> bool
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let whole = head.len.saturating_add(head.length);
    while buf.len() < whole {
        buf.reserve(whole - buf.len());
        match tokio::time::timeout(body_timeout, io.read_buf(buf)).await {
            Ok(Ok(0) | Err(_)) => {
                // The client left: its line (499) says so, and names the
                // route it was for.
                let id = request_id(gw, &head, buf, peer);
                if let Some(owed) = owed_line(gw, &head, buf, &id) {
                    let route = head.route.as_deref().map(RouteMetrics::label);
                    owed.answered(route, 499, "client_closed", None);
                }
                return false;
            }
            Err(_) => {
                // Stalled past `body_timeout`: 400, as hyper's path
                // answers a body that broke off.
                let id = request_id(gw, &head, buf, peer);
                let owed = owed_line(gw, &head, buf, &id);
                let mut res = client_body_broke();
                let status = res.status().as_u16();
                let route = head.route.as_deref();
                if let Some(route) = route {
                    route.count(of_code("invalid_request"));
                }
                if let Some(owed) = owed {
                    owed.answered(
                        route.map(RouteMetrics::label),
                        status,
                        "invalid_request",
                        None,
                    );
                }
                res.headers_mut().insert(access::REQUEST_ID, id.clone());
                write_answer((io, buf), out, res, false, true).await;
                return false;
            }
            Ok(Ok(_)) => {}
        }
    }
    let bytes = buf.split_to(whole).freeze();
    let Some(req) = head.request(&bytes, peer) else {
        // httparse took it and the `http` crate did not: not expected,
        // and not the backend's to see.
        let mut res = super::answers::invalid_request(
            "The request's head could not be read as HTTP (its method, target or a header).",
        );
        res.headers_mut().insert(access::REQUEST_ID, fresh_id());
        write_answer((io, buf), out, res, false, true).await;
        return false;
    };
    drop(bytes);
    let is_head = req.method() == Method::HEAD;
    let Some(res) = unless_client_leaves(io, buf, dispatch(Arc::clone(gw), req)).await else {
        return false;
    };
    let closing = head.close || stop.stopped();
    write_answer((io, buf), out, res, is_head, closing).await
}

/// The access-log line owed for a request whose body never came whole.
fn owed_line<'a>(
    gw: &'a Gateway,
    head: &Head,
    buf: &[u8],
    id: &'a HeaderValue,
) -> Option<Owed<'a>> {
    let sink = gw.access.as_ref()?;
    let method = Method::from_bytes(&buf[head.method.clone()]).ok()?;
    let target = std::str::from_utf8(&buf[head.target.clone()]).ok()?;
    let path = target.split('?').next().unwrap_or(target);
    Some(Owed::new(sink, id, &method, path))
}

/// The id of a request `dispatch` never saw, by its rule
/// ([`access::keeps_given_id`]): the one a trusted proxy sent, else a
/// fresh one.
fn request_id(gw: &Gateway, head: &Head, buf: &[u8], peer: SocketAddr) -> HeaderValue {
    let mut given = head
        .headers
        .iter()
        .filter(|(name, _)| {
            buf[name.clone()].eq_ignore_ascii_case(access::REQUEST_ID.as_str().as_bytes())
        })
        .map(|(_, value)| &buf[value.clone()]);
    let first = given.next();
    let count = usize::from(first.is_some()) + given.count();
    let trusted = gw.live.load().caller.is_trusted(peer.ip());
    first
        .filter(|v| access::keeps_given_id(v, count, trusted))
        .and_then(|v| HeaderValue::from_bytes(v).ok())
        .unwrap_or_else(fresh_id)
}

fn fresh_id() -> HeaderValue {
    HeaderValue::from_bytes(&access::fresh_id()).unwrap_or(HeaderValue::from_static("-"))
}
