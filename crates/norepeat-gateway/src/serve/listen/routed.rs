//! A route's request on the lane (issue 39): an HTTP/1.1 request the
//! pass-through's lane (`listen/lane.rs`) does not forward itself, a
//! route's or one with a body, here whole (its body, up to
//! [`IN_HAND`](crate::serve::http1::IN_HAND), came with its head), built into the `Request` hyper would
//! have built from it, answered by [`dispatch`], the one implementation
//! of the refusals, the routes and their stacks, and its answer written
//! by hand ([`write_answer`]): the same request without hyper's server
//! (its dispatcher, its body channel, its answer encoder), 2-3 % fewer
//! instructions a fingerprint request (BENCHMARKS.md, issue 39).
//!
//! Only a body that has come with its head is taken: waiting for one
//! would change what the route answers (its rate limit and its guard's
//! identity refuse from the head alone, before the body is read, and a
//! backend may answer an upload before reading all of it). Any other body
//! streams through hyper, which reads it as the route asks. What the
//! lane leaves to hyper, it still leaves: `Transfer-Encoding`, `Expect`,
//! `Upgrade`, a body over 64 KiB, HTTP/1.0, the gateway's own routes, and
//! every request once the shutdown has begun.

use crate::serve::gateway::Gateway;
use crate::serve::http1::{unless_client_leaves, write_answer};
use crate::serve::listen::timed::Stop;
use crate::serve::log::request_id;
use crate::serve::proxy::dispatch;
use crate::serve::route::ChosenIn;
use crate::serve::upstream::BodyInHand;
use axum::body::Body;
use axum::extract::ConnectInfo;
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};

/// A request head the lane parsed, as places in the client's bytes.
pub(crate) struct Head {
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
    pub(crate) fn new(
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
    /// the peer's address when there is one.
    pub(crate) fn request(&self, bytes: &Bytes, peer: Option<SocketAddr>) -> Option<Request<Body>> {
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
        if let Some(peer) = peer {
            req.extensions_mut().insert(ConnectInfo(peer));
        }
        if self.length > 0 {
            req.extensions_mut().insert(BodyInHand);
        }
        Some(req)
    }
}

/// Serves the request whose head, and body, start `buf`: its answer from
/// [`dispatch`] written to `io`. While the answer is made the client's
/// socket is read: a client that leaves drops the request's future, as
/// hyper's server does (its access-log line says 499). `false`: the
/// connection is to be closed.
pub(crate) async fn serve<S>(
    io: &mut S,
    buf: &mut BytesMut,
    (head, chosen): (Head, Option<ChosenIn>),
    (gw, peer, stop): (&Arc<Gateway>, SocketAddr, &Stop),
    out: &mut Vec<u8>,
) -> bool
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    // The lane hands over only a request that is here whole.
    let whole = head.len.saturating_add(head.length).min(buf.len());
    let bytes = buf.split_to(whole).freeze();
    let Some(req) = head.request(&bytes, Some(peer)) else {
        // httparse took it and the `http` crate did not: not expected,
        // and not the backend's to see.
        let mut res = crate::serve::answers::invalid_request(
            "The request's head could not be read as HTTP (its method, target or a header).",
        );
        res.headers_mut()
            .insert(request_id::REQUEST_ID, request_id::fresh_id_value());
        write_answer((io, buf), out, res, false, true).await;
        return false;
    };
    drop(bytes);
    let is_head = req.method() == Method::HEAD;
    // Pinned here, where it is made: handed on by value, the request's
    // future (kilobytes: the guard, the store, the upstream) would be
    // copied whole into the waiting's own.
    let work = std::pin::pin!(dispatch(Arc::clone(gw), req, chosen));
    let Some(res) = unless_client_leaves(io, buf, work).await else {
        return false;
    };
    let closing = head.close || stop.stopped();
    write_answer((io, buf), out, res, is_head, closing).await
}
