//! A route's request on the lane (issue 39): an HTTP/1.1 request the
//! pass-through's lane (`passthrough.rs`) does not forward itself, a
//! route's or one with a body, read whole (its body up to
//! [`IN_HAND`](super::h1::IN_HAND)), built into the `Request` hyper would
//! have built from it, answered by [`dispatch`], the one implementation
//! of the refusals, the routes and their stacks, and its answer written
//! by hand: the same request without hyper's server (its dispatcher, its
//! body channel, its answer encoder), 7 % less CPU a fingerprint request
//! (BENCHMARKS.md, issue 39).
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
use super::h1::header;
use super::passthrough::{now_as_http_date, unless_client_leaves, write_problem};
use super::request::dispatch;
use axum::body::Body;
use axum::extract::ConnectInfo;
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body::{Body as _, Frame};
use std::net::SocketAddr;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

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
}

impl Head {
    /// The head of `len` bytes at the start of `buf`, whose `method`,
    /// `target` and `headers` httparse read from it.
    pub(super) fn new(
        len: usize,
        length: u64,
        (method, target): (&str, &str),
        headers: &[httparse::Header<'_>],
        close: bool,
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
                // The client left: its line (499) says so.
                let id = request_id(gw, &head, buf, peer);
                drop(owed_line(gw, &head, buf, &id));
                return false;
            }
            Err(_) => {
                // Stalled past `body_timeout`: 400, as hyper's path
                // answers a body that broke off.
                let id = request_id(gw, &head, buf, peer);
                let owed = owed_line(gw, &head, buf, &id);
                let res = client_body_broke();
                let status = res.status().as_u16();
                if let Some(owed) = owed {
                    owed.answered(None, status, "invalid_request", None);
                }
                write_problem(io, res, &id, true, false).await;
                return false;
            }
            Ok(Ok(_)) => {}
        }
    }
    let bytes = buf.split_to(whole).freeze();
    let Some(req) = head.request(&bytes, peer) else {
        // httparse took it and the `http` crate did not: not expected,
        // and not the backend's to see.
        let res = super::answers::invalid_request(
            "The request's head could not be read as HTTP (its method, target or a header).",
        );
        write_problem(io, res, &fresh_id(), true, false).await;
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

/// How the answer's body is framed for the client.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// No body: `HEAD`, 1xx, 204, 304.
    None,
    Length(u64),
    Chunked,
}

/// The most of an answer's body gathered before a write.
const GATHER: usize = 64 * 1024;

/// Writes `res` to `io` as hyper's server writes an answer: its headers
/// as they are but its framing's (a `Content-Length` its body or its
/// header gives, else chunked), a `Date` when it has none, and
/// `Connection: close` when the connection closes after it. The head and
/// the body's first pieces go in one write. `false`: the connection is to
/// be closed (asked for, or the body broke off).
async fn write_answer<S>(
    (io, buf): (&mut S, &mut BytesMut),
    out: &mut Vec<u8>,
    res: Response<Body>,
    head: bool,
    mut closing: bool,
) -> bool
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (parts, mut body) = res.into_parts();
    let status = parts.status;
    out.clear();
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    // The upstream's own phrase when it had one (`h1.rs` keeps it).
    match parts.extensions.get::<hyper::ext::ReasonPhrase>() {
        Some(reason) => out.extend_from_slice(reason.as_bytes()),
        None => out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes()),
    }
    out.extend_from_slice(b"\r\n");
    let mut given = None;
    let mut dated = false;
    for (name, value) in &parts.headers {
        if name == http::header::CONNECTION {
            // `dispatch` asks a draining connection's client to leave.
            closing |= value
                .as_bytes()
                .split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"));
            continue;
        }
        if name == http::header::TRANSFER_ENCODING {
            continue;
        }
        if name == http::header::CONTENT_LENGTH {
            // The first that reads as a length is the answer's.
            if given.is_some() {
                continue;
            }
            // Digits only, as the upstream parsers let through.
            let digits = value.as_bytes().trim_ascii();
            match std::str::from_utf8(digits)
                .ok()
                .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|d| d.parse::<u64>().ok())
            {
                Some(n) => given = Some(n),
                None => continue,
            }
        }
        dated |= name == http::header::DATE;
        header(out, name.as_str().as_bytes(), value.as_bytes());
    }
    let no_body = head
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let exact = body.size_hint().exact();
    let framing = match (given, exact) {
        _ if no_body => Framing::None,
        (Some(n), _) => Framing::Length(n),
        (None, Some(n)) => Framing::Length(n),
        (None, None) => Framing::Chunked,
    };
    let mut n = itoa::Buffer::new();
    match framing {
        Framing::Length(len) if given.is_none() => {
            header(out, b"content-length", n.format(len).as_bytes());
        }
        // A HEAD's answer says the length a GET's body would have.
        Framing::None if head && given.is_none() && status != StatusCode::NOT_MODIFIED => {
            if let Some(len) = exact.filter(|&len| len > 0) {
                header(out, b"content-length", n.format(len).as_bytes());
            }
        }
        Framing::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        _ => {}
    }
    if !dated {
        now_as_http_date(|date| header(out, b"date", date));
    }
    if closing {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if framing == Framing::None {
        drop(body);
        return io.write_all(out).await.is_ok() && !closing;
    }
    let mut left = match framing {
        Framing::Length(n) => n,
        _ => 0,
    };
    loop {
        // A frame ready now joins the bytes still to write; one not yet
        // ready is waited for once they are written.
        let ready = std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx)));
        let frame = match ready.await {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                if io.write_all(out).await.is_err() {
                    return false;
                }
                out.clear();
                // A client that leaves while the body is quiet (a stream,
                // a long poll) ends it, and the upstream's connection.
                let next = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx));
                match unless_client_leaves(io, buf, next).await {
                    Some(frame) => frame,
                    None => return false,
                }
            }
        };
        let data = match frame {
            None => break,
            Some(Ok(frame)) => match Frame::into_data(frame) {
                Ok(data) => data,
                // Trailers: not written (hyper's server writes them only
                // to a client that asked with `TE: trailers`).
                Err(_) => continue,
            },
            Some(Err(_)) => {
                // Broken off: what came is written, the connection closed
                // so the client sees the body is not whole.
                let _ = io.write_all(out).await;
                return false;
            }
        };
        match framing {
            Framing::Length(_) => {
                let len = data.len() as u64;
                if len > left {
                    // More than it said: not sent, as hyper refuses it.
                    let _ = io.write_all(out).await;
                    return false;
                }
                left -= len;
                out.extend_from_slice(&data);
            }
            _ if data.is_empty() => {}
            _ => {
                let mut size = [0u8; 16];
                out.extend_from_slice(super::h1::hex_len(data.len(), &mut size));
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(&data);
                out.extend_from_slice(b"\r\n");
            }
        }
        if out.len() >= GATHER {
            if io.write_all(out).await.is_err() {
                return false;
            }
            out.clear();
        }
    }
    if framing == Framing::Chunked {
        out.extend_from_slice(b"0\r\n\r\n");
    }
    let written = io.write_all(out).await.is_ok();
    out.clear();
    // A body shorter than its length: the client must not wait for more.
    written && left == 0 && !closing
}
