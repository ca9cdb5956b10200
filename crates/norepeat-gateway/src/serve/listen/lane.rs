// Over 400 lines on purpose: the lane reads a head, writes the upstream's request and streams its answer in one pass over the bytes (issue 39); its steps share one set of buffers and read best in order.
//! The pass-through's lane: an unguarded HTTP/1.1 request read, rewritten
//! and written in one pass over its bytes, on the client's own task, as
//! NGINX's `proxy_pass` does (issue 39).
//!
//! A cleartext connection starts here. A request the lane takes is one no
//! route takes and that has nothing the lane leaves to hyper: HTTP/1.1, no
//! body (no `Transfer-Encoding`, a `Content-Length` of 0 at most), no
//! `Upgrade` or `Expect`, a target without a fragment, one `Host` in
//! visible ASCII, a `Connection` of `keep-alive` or `close` at most, an
//! `http://` upstream, the gateway not draining. Its head is parsed once
//! (`httparse`, the parser hyper uses), the route chosen as
//! [`crate::serve::proxy::route_request`] chooses it ([`choose`]; a
//! choice the headers cannot change is handed to `dispatch` with the
//! request, [`Chosen`]), and the upstream's request written from the
//! client's bytes with the hop-by-hop headers dropped and the forwarding
//! headers and request id added as `upstream` adds them. The answer's head is parsed
//! and written on the same way, its body streamed through (a chunked one
//! as it came, one with no length chunked by the lane); the upstream
//! connection goes back to its pool ([`crate::serve::upstream::pool::Pick::put_raw`])
//! when the answer has ended. No `HeaderMap`, no task per upstream
//! connection, no channel between the two.
//!
//! A route's request, or one with a body, is read on the lane too when it
//! has none of the above and its body (up to 64 KiB) may be read first:
//! it is answered by `dispatch`, its answer written by hand (`listen/routed.rs`).
//!
//! Every other request, and every request after it on its connection, is
//! hyper's: the connection is handed over with the bytes read so far
//! ([`Left::ToHyper`]), so a route, a refusal, an odd request or a
//! protocol upgrade is answered by the one implementation of each.

use super::routed;
use crate::config::{normalize_host, normalize_path};
use crate::serve::answers::{upstream_switched, upstream_timeout, upstream_unavailable};
use crate::serve::gateway::Gateway;
use crate::serve::http1::{
    ANSWER_HEADERS, Chunks, Framing, IN_HAND, MAX_ANSWER_HEAD, READ, answer_framing, chunk,
    content_length, header, now_as_http_date, unless_client_leaves, write_answer,
};
use crate::serve::listen::timed::{InFlight, Stop, Watch};
use crate::serve::log::access::Owed;
use crate::serve::log::request_id;
use crate::serve::proxy::PASSTHROUGH_TIMEOUT;
use crate::serve::reply::{ForClient, names_text};
use crate::serve::route::table::Routes;
use crate::serve::route::{Choice, Chosen, ChosenIn, choose};
use crate::serve::upstream::headers::{forwarded_element, ip_text};
use crate::serve::upstream::pool::Pick;
use bytes::{Buf, Bytes, BytesMut};
use http::HeaderValue;
use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// How a connection left the lane.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Left {
    /// Closed: by the client, after `Connection: close`, a broken answer,
    /// a timeout or the shutdown.
    Closed,
    /// A request the lane does not take: hyper serves the connection from
    /// that request on (the bytes read so far are still to be read).
    ToHyper,
}

/// A request head longer than this is hyper's (which answers one past its
/// own limit).
const MAX_HEAD: usize = 16 * 1024;
/// The most headers a request the lane takes has (hyper takes 100).
const REQUEST_HEADERS: usize = 64;

/// The first bytes of an HTTP/2 connection (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0";

/// Serves requests from `io` while the lane takes them. `buf` holds the
/// bytes read and not yet used (handed on to hyper with [`Left::ToHyper`]).
pub(crate) async fn serve<S>(
    io: &mut S,
    buf: &mut BytesMut,
    watch: &Arc<Watch>,
    peer: SocketAddr,
    gw: &Arc<Gateway>,
    stop: &Stop,
) -> Left
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut lane = Lane {
        out: Vec::with_capacity(1024),
        answer: BytesMut::with_capacity(READ),
        chosen: None,
    };
    // Whether a request was answered on this connection.
    let mut served = false;
    loop {
        // Up to where `buf` is known to hold no head's end.
        let mut scanned = 0;
        // A whole head, or the connection's end.
        let request = loop {
            if !buf.is_empty() {
                let n = buf.len().min(PREFACE.len());
                if buf[..n] == PREFACE[..n] {
                    // HTTP/2 by prior knowledge is hyper's; after HTTP/1.1
                    // requests on the same connection it is no request.
                    return if served { Left::Closed } else { Left::ToHyper };
                }
                // A head is parsed once its end may have come: one sent a
                // byte at a time is not parsed again at every byte.
                if head_may_end(buf, scanned) {
                    match lane.prepare(buf, gw, peer.ip()) {
                        Prepared::Ready(r) => break Next::Forward(r),
                        Prepared::Routed(head) => break Next::Routed(head),
                        Prepared::Partial => {}
                        Prepared::ToHyper => return Left::ToHyper,
                    }
                }
                if buf.len() >= MAX_HEAD {
                    return Left::ToHyper;
                }
                scanned = buf.len();
            }
            buf.reserve(READ);
            let read = if buf.is_empty() {
                // Between requests: the shutdown closes an idle connection.
                tokio::select! {
                    read = io.read_buf(buf) => read,
                    () = stop.wait() => return Left::Closed,
                }
            } else {
                io.read_buf(buf).await
            };
            match read {
                Ok(0) | Err(_) => return Left::Closed,
                Ok(_) => {}
            }
        };
        let in_flight = InFlight::start(watch);
        let kept = match request {
            Next::Forward(request) => {
                buf.advance(request.len);
                let owed = gw.access.as_ref().zip(request.logged.as_ref()).map(
                    |(sink, (method, path, host))| {
                        Owed::new(sink, &request.id, method, path).from(
                            Some(peer.ip()),
                            Some(host),
                            Some(0),
                        )
                    },
                );
                lane.exchange(io, buf, &request, stop, owed).await
            }
            Next::Routed(head) => {
                let chosen = lane.chosen.take();
                routed::serve(io, buf, (head, chosen), (gw, peer, stop), &mut lane.out).await
            }
        };
        drop(in_flight);
        served = true;
        if !kept {
            let _ = io.shutdown().await;
            return Left::Closed;
        }
    }
}

/// A request the lane takes, its upstream bytes in [`Lane::out`].
struct Request {
    /// Its head's length in the client's bytes.
    len: usize,
    /// `HEAD`: an answer without a body.
    head: bool,
    /// The client asked for `Connection: close`.
    close: bool,
    id: HeaderValue,
    /// Its method and path, for the access log (when there is one).
    logged: Option<(http::Method, String, Vec<u8>)>,
    /// A browser's request (by its `Accept`, or its `Origin` under
    /// `cors`): its head and a copy of its bytes, kept to shape a refusal
    /// of the lane's own as `dispatch` shapes one (a page, CORS headers);
    /// built into a request only then. None for any other client (boxed:
    /// the API client's request stays small).
    browser: Option<Box<(routed::Head, Bytes)>>,
    live: Arc<Routes>,
}

/// The next request on a connection.
enum Next {
    /// Forwarded by the lane itself.
    Forward(Request),
    /// `dispatch`'s, read and answered on the lane.
    Routed(routed::Head),
}

enum Prepared {
    Ready(Request),
    /// A request for `dispatch`, the whole stack's (`listen/routed.rs`).
    Routed(routed::Head),
    Partial,
    ToHyper,
}

/// What a header is to the lane.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Host,
    ContentLength,
    TransferEncoding,
    Upgrade,
    Expect,
    Connection,
    /// `Keep-Alive`, `Proxy-Connection`, `TE`, `Trailer`: dropped.
    HopByHop,
    XForwardedFor,
    /// `X-Forwarded-Host`, `X-Forwarded-Proto`: the gateway's own.
    XForwardedOwn,
    Forwarded,
    RequestId,
    /// `Accept`, `Origin`: whether a refusal of the lane's own is shaped
    /// for a browser (`reply.rs`).
    Accept,
    Origin,
    Other,
}

fn kind(name: &str) -> Kind {
    let is = |s: &str| name.eq_ignore_ascii_case(s);
    match name.len() {
        2 if is("te") => Kind::HopByHop,
        4 if is("host") => Kind::Host,
        6 if is("expect") => Kind::Expect,
        6 if is("accept") => Kind::Accept,
        6 if is("origin") => Kind::Origin,
        7 if is("upgrade") => Kind::Upgrade,
        7 if is("trailer") => Kind::HopByHop,
        9 if is("forwarded") => Kind::Forwarded,
        10 if is("connection") => Kind::Connection,
        10 if is("keep-alive") => Kind::HopByHop,
        12 if is("x-request-id") => Kind::RequestId,
        14 if is("content-length") => Kind::ContentLength,
        15 if is("x-forwarded-for") => Kind::XForwardedFor,
        16 if is("proxy-connection") => Kind::HopByHop,
        16 if is("x-forwarded-host") => Kind::XForwardedOwn,
        17 if is("transfer-encoding") => Kind::TransferEncoding,
        17 if is("x-forwarded-proto") => Kind::XForwardedOwn,
        _ => Kind::Other,
    }
}

/// An answer's head, written for the client in [`Lane::out`].
struct AnswerHead {
    len: usize,
    status: u16,
    framing: Framing,
    /// The upstream connection may carry a next request once this answer
    /// has ended.
    reusable: bool,
}

/// A connection's buffers, kept from one request to the next.
struct Lane {
    /// The upstream's request, then the client's answer head.
    out: Vec<u8>,
    /// The upstream's bytes.
    answer: BytesMut,
    /// The route of the request handed to `dispatch`, when the lane's
    /// choice is its ([`Chosen`], with the routes it was made in).
    chosen: Option<ChosenIn>,
}

impl Lane {
    /// Reads the head at the start of `buf`: the request to forward (its
    /// bytes for the upstream in `self.out`), or why not.
    fn prepare(&mut self, buf: &[u8], gw: &Gateway, peer: IpAddr) -> Prepared {
        let mut headers = [httparse::EMPTY_HEADER; REQUEST_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        let len = match req.parse(buf) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Prepared::Partial,
            Err(_) => return Prepared::ToHyper,
        };
        let (Some(method), Some(target), Some(1)) = (req.method, req.path, req.version) else {
            return Prepared::ToHyper;
        };
        // A method not in upper case is refused (hyper's path says why);
        // CONNECT tunnels. The gateway's own routes are the router's.
        // A target with a fragment is hyper's, which forwards it without
        // (the lane writes the target as it came).
        if method == "CONNECT"
            || method.bytes().any(|b| b.is_ascii_lowercase())
            || !target.starts_with('/')
            || target.contains('#')
            || target.starts_with("/.norepeat/")
            || gw.draining.started()
        {
            return Prepared::ToHyper;
        }
        // The target as hyper would take it (the `http` crate's rules).
        let Ok(pq) = http::uri::PathAndQuery::try_from(target) else {
            return Prepared::ToHyper;
        };
        let mut host = None;
        let mut hosts = 0;
        let mut lengths = 0;
        let mut length = 0u64;
        let mut close = false;
        let mut ids = 0;
        let mut given_id = None;
        // Whether a refusal of the lane's own is shaped for a browser.
        let mut origin = false;
        let mut accept_text = false;
        // Each header's kind, told once for the passes below.
        let mut kinds = [Kind::Other; REQUEST_HEADERS];
        for (h, k) in req.headers.iter().zip(kinds.iter_mut()) {
            *k = kind(h.name);
            match *k {
                Kind::Host => {
                    hosts += 1;
                    host = Some(h.value);
                }
                Kind::ContentLength => {
                    lengths += 1;
                    // Digits only, as hyper reads it; two are hyper's.
                    match content_length(h.value) {
                        Some(n) if lengths == 1 => length = n,
                        _ => return Prepared::ToHyper,
                    }
                }
                Kind::TransferEncoding | Kind::Upgrade | Kind::Expect => {
                    return Prepared::ToHyper;
                }
                Kind::Connection => {
                    for token in h.value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                        if token.eq_ignore_ascii_case(b"close") {
                            close = true;
                        } else if !(token.is_empty() || token.eq_ignore_ascii_case(b"keep-alive")) {
                            // It names headers to drop: hyper's path.
                            return Prepared::ToHyper;
                        }
                    }
                }
                Kind::RequestId => {
                    ids += 1;
                    given_id = Some(h.value);
                }
                Kind::Origin => origin = true,
                Kind::Accept => accept_text |= names_text(h.value),
                _ => {}
            }
        }
        // A Host with userinfo or an empty label is refused on hyper's path.
        let Some(host) = host.filter(|h| {
            hosts == 1
                && h.iter().all(u8::is_ascii_graphic)
                && !h.contains(&b'@')
                && !h.windows(2).any(|w| w == b"..")
        }) else {
            return Prepared::ToHyper;
        };
        // Visible ASCII: text.
        let host_text = std::str::from_utf8(host).unwrap_or_default();
        let live = gw.live.load_full();
        let path = pq.path();
        let normalized = normalize_path(path);
        let site = (live.by_host || !live.hosts.is_empty())
            .then(|| normalize_host(host_text))
            .flatten();
        // Another site's request (`hosts`) is answered 421 on hyper's path.
        if !live.hosts.is_empty() && site.as_ref().is_none_or(|s| !live.hosts.contains(s)) {
            return Prepared::ToHyper;
        }
        let choice = choose(&live, method, &normalized, path, site.as_ref());
        let passthrough = matches!(choice, Choice::Passthrough);
        let client = live.passthrough.get();
        if !passthrough || length > 0 || !client.is_plain() {
            // A route's request, or one with a body: `dispatch`'s, served
            // on the lane when its body, small, came whole with its head.
            // Any other body streams through hyper, read as the route asks:
            // after what it refuses from the head (its rate limit, its
            // guard's identity), and over the route's `max_request_body`
            // refused from its length (413); a backend may answer an
            // upload before reading all of it.
            let max_body = match choice {
                Choice::Route { at, .. } => live.list[at].max_body,
                _ => u64::MAX,
            };
            let here = buf.len() as u64 >= len as u64 + length;
            if length > IN_HAND.min(max_body) || !here {
                return Prepared::ToHyper;
            }
            // Chosen here, once, when the headers could not change it.
            // Kept beside the head, not in it: the head is moved on.
            self.chosen = choice.settled(&live).then(|| {
                let normalized = match normalized {
                    Cow::Borrowed(_) => None,
                    Cow::Owned(p) => Some(p),
                };
                (
                    live,
                    Chosen {
                        normalized,
                        site,
                        choice,
                    },
                )
            });
            return Prepared::Routed(routed::Head::new(
                len,
                length,
                (method, target),
                req.headers,
                close,
                buf,
            ));
        }
        let trusted = live.caller.is_trusted(peer);
        let kept_id = given_id.filter(|v| request_id::keeps_given_id(v, ids, trusted));
        let id = match kept_id {
            Some(v) => HeaderValue::from_bytes(v),
            None => HeaderValue::from_bytes(&request_id::fresh_id()),
        };
        let Ok(id) = id else {
            return Prepared::ToHyper;
        };

        // The upstream's request.
        let out = &mut self.out;
        out.clear();
        out.extend_from_slice(method.as_bytes());
        out.push(b' ');
        if let Some(base) = client.base() {
            out.extend_from_slice(base.as_bytes());
        }
        out.extend_from_slice(target.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\n");
        for (h, k) in req.headers.iter().zip(kinds) {
            let keep = match k {
                Kind::Connection | Kind::HopByHop | Kind::XForwardedFor | Kind::XForwardedOwn => {
                    false
                }
                Kind::Forwarded => trusted,
                Kind::RequestId => kept_id.is_some(),
                _ => true,
            };
            if keep {
                header(out, h.name.as_bytes(), h.value);
            }
        }
        if kept_id.is_none() {
            header(out, b"x-request-id", id.as_bytes());
        }
        let mut ip = [0u8; 64];
        let ip = ip_text(peer, &mut ip);
        out.extend_from_slice(b"x-forwarded-for: ");
        if trusted {
            for (h, k) in req.headers.iter().zip(kinds) {
                if k == Kind::XForwardedFor {
                    out.extend_from_slice(h.value);
                    out.extend_from_slice(b", ");
                }
            }
        }
        out.extend_from_slice(ip);
        out.extend_from_slice(b"\r\nx-forwarded-proto: http\r\n");
        header(out, b"x-forwarded-host", host);
        out.extend_from_slice(b"forwarded: ");
        forwarded_element(out, peer, ip, "http", Some(host));
        out.extend_from_slice(b"\r\n\r\n");

        let browser = (accept_text || (origin && !live.cors.is_empty())).then(|| {
            let head = routed::Head::new(len, 0, (method, target), req.headers, close, buf);
            Box::new((head, Bytes::copy_from_slice(&buf[..len])))
        });

        let logged = match gw.access {
            Some(_) => match http::Method::from_bytes(method.as_bytes()) {
                Ok(m) => Some((m, path.to_owned(), host.to_vec())),
                Err(_) => return Prepared::ToHyper,
            },
            None => None,
        };
        Prepared::Ready(Request {
            len,
            head: method == "HEAD",
            close,
            id,
            logged,
            browser,
            live,
        })
    }

    /// Sends the request in `self.out` upstream and its answer to the
    /// client. `false`: the client's connection is to be closed.
    async fn exchange<S>(
        &mut self,
        io: &mut S,
        buf: &mut BytesMut,
        request: &Request,
        stop: &Stop,
        owed: Option<Owed<'_>>,
    ) -> bool
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let client = request.live.passthrough.get();
        let mut pick = client.pick();
        let start = std::time::Instant::now();
        // The head must come within the pass-through's timeout (no body
        // to wait for: it counts from now). A client that leaves meanwhile
        // cancels the upstream request, as hyper's path does, and its
        // access-log line says 499.
        let send = tokio::time::timeout(PASSTHROUGH_TIMEOUT, self.send(&mut pick, request));
        let Some(sent) = unless_client_leaves(io, buf, send).await else {
            return false;
        };
        let sent = sent.unwrap_or(Err(Failed::Unknown));
        let upstream_took = start.elapsed();
        let (mut up, head) = match sent {
            Ok(answer) => answer,
            Err(failure) => {
                // As hyper's path says it (`upstream`).
                tracing::debug!(failure = ?failure, "no answer from the upstream");
                let (mut res, outcome) = match failure {
                    Failed::Unavailable => (upstream_unavailable(), "upstream_unavailable"),
                    Failed::Unknown => (upstream_timeout(), "upstream_timeout"),
                    Failed::Switched => (upstream_switched(), "upstream_switched_protocols"),
                };
                // As `dispatch` shapes a refusal for its client.
                if let Some((head, bytes)) = request.browser.as_deref()
                    && let Some(req) = head.request(bytes, None)
                {
                    res = ForClient::of(&request.live, &req).shape(res, false);
                }
                let status = res.status().as_u16();
                res.headers_mut()
                    .insert(request_id::REQUEST_ID, request.id.clone());
                let closing = request.close || stop.stopped();
                let kept = write_answer((io, buf), &mut self.out, res, request.head, closing).await;
                if let Some(owed) = owed {
                    owed.answered(None, status, outcome, Some(upstream_took));
                }
                return kept;
            }
        };
        if let Some(mut owed) = owed {
            let bytes_out = match head.framing {
                Framing::Length(n) => Some(n),
                Framing::Empty => Some(0),
                _ => None,
            };
            owed.with_answer(Some(head.status), bytes_out);
            owed.answered(None, head.status, "passthrough", Some(upstream_took));
        }
        self.answer.advance(head.len);
        let closing = request.close || stop.stopped();
        if closing {
            // Before the blank line that ends the head.
            self.out.truncate(self.out.len() - 2);
            self.out.extend_from_slice(b"connection: close\r\n\r\n");
        }
        let streamed = self.body(io, buf, (&mut up, &mut pick), head.framing).await;
        if streamed == Passed::Whole && head.reusable && self.answer.is_empty() {
            pick.put_raw(up);
        }
        streamed == Passed::Whole && !closing
    }

    /// Writes the request to an idle upstream connection (another, new,
    /// one when it turns out closed before a byte of the request left) and
    /// reads its answer's head, written for the client in `self.out`.
    async fn send(
        &mut self,
        client: &mut Pick<'_>,
        request: &Request,
    ) -> Result<(TcpStream, AnswerHead), Failed> {
        let mut reused = client.take_raw();
        loop {
            let (mut up, fresh) = match reused.take() {
                Some(up) => (up, false),
                None => (
                    client
                        .connect_raw()
                        .await
                        .map_err(|_| Failed::Unavailable)?,
                    true,
                ),
            };
            match up.write(&self.out).await {
                Ok(0) | Err(_) if !fresh => continue,
                Ok(0) | Err(_) => return Err(Failed::Unavailable),
                Ok(n) if n < self.out.len() => {
                    up.write_all(&self.out[n..])
                        .await
                        .map_err(|_| Failed::Unknown)?;
                }
                Ok(_) => {}
            }
            self.answer.clear();
            let head = self.read_head(&mut up, request).await?;
            return Ok((up, head));
        }
    }

    /// Reads the upstream's answer head into `self.answer` (1xx answers
    /// skipped) and writes the client's head in `self.out`.
    async fn read_head(
        &mut self,
        up: &mut TcpStream,
        request: &Request,
    ) -> Result<AnswerHead, Failed> {
        loop {
            if !self.answer.is_empty() {
                match self.answer_head(request)? {
                    Some(head) if (100..200).contains(&head.status) => {
                        // 101 was not asked for (an upgrade is hyper's):
                        // nothing is switched (h2c would pass every guard).
                        if head.status == 101 {
                            return Err(Failed::Switched);
                        }
                        self.answer.advance(head.len);
                        continue;
                    }
                    Some(head) => return Ok(head),
                    None if self.answer.len() >= MAX_ANSWER_HEAD => return Err(Failed::Unknown),
                    None => {}
                }
            }
            self.answer.reserve(READ);
            match up.read_buf(&mut self.answer).await {
                Ok(0) | Err(_) => return Err(Failed::Unknown),
                Ok(_) => {}
            }
        }
    }

    /// The answer head at the start of `self.answer`, if whole: its
    /// framing, and the client's head written in `self.out`.
    fn answer_head(&mut self, request: &Request) -> Result<Option<AnswerHead>, Failed> {
        let mut headers = [httparse::EMPTY_HEADER; ANSWER_HEADERS];
        let mut res = httparse::Response::new(&mut headers);
        let len = match res.parse(&self.answer) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(_) => return Err(Failed::Unknown),
        };
        let (Some(version), Some(status)) = (res.version, res.code) else {
            return Err(Failed::Unknown);
        };
        if (100..200).contains(&status) {
            return Ok(Some(AnswerHead {
                len,
                status,
                framing: Framing::Empty,
                reusable: false,
            }));
        }
        let answer = answer_framing(request.head, status, version, res.headers)
            .map_err(|()| Failed::Unknown)?;
        let framing = answer.framing;
        let out = &mut self.out;
        out.clear();
        out.extend_from_slice(b"HTTP/1.1 ");
        let mut code = itoa::Buffer::new();
        out.extend_from_slice(code.format(status).as_bytes());
        out.push(b' ');
        out.extend_from_slice(res.reason.unwrap_or_default().as_bytes());
        out.extend_from_slice(b"\r\n");
        let mut dated = false;
        for h in res.headers.iter() {
            let name = h.name;
            dated |= name.eq_ignore_ascii_case("date");
            let dropped = answer.is_hop_by_hop(name)
                || name.eq_ignore_ascii_case("x-request-id")
                // A length beside a chunked body is not the body's.
                || (!answer.codings.is_empty() && name.eq_ignore_ascii_case("content-length"));
            if !dropped {
                header(out, name.as_bytes(), h.value);
            }
        }
        // The codings as the upstream applied them (a `gzip` before the
        // `chunked` stays the client's to undo), `chunked` last.
        match framing {
            Framing::Chunked => header(out, b"transfer-encoding", answer.codings),
            Framing::UntilClose if !answer.codings.is_empty() => {
                out.extend_from_slice(b"transfer-encoding: ");
                out.extend_from_slice(answer.codings);
                out.extend_from_slice(b", chunked\r\n");
            }
            Framing::UntilClose => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
            _ => {}
        }
        header(out, b"x-request-id", request.id.as_bytes());
        // As hyper's server does for an answer without one (RFC 9110
        // §6.6.1: a server with a clock sends it).
        if !dated {
            now_as_http_date(|date| header(out, b"date", date));
        }
        out.extend_from_slice(b"\r\n");
        Ok(Some(AnswerHead {
            len,
            status,
            framing,
            reusable: answer.reusable,
        }))
    }

    /// Writes the head in `self.out` and the body after it: the bytes in
    /// `self.answer` first (in the head's write), then what `up` sends,
    /// until `framing` says the body has ended. A body that ends with the
    /// connection is chunked for the client. The pick's lease ends once
    /// the answer is read whole, before its last bytes are written.
    async fn body<S>(
        &mut self,
        io: &mut S,
        buf: &mut BytesMut,
        (up, pick): (&mut TcpStream, &mut Pick<'_>),
        framing: Framing,
    ) -> Passed
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let mut left = match framing {
            Framing::Length(n) => n,
            _ => 0,
        };
        let mut chunks = Chunks::default();
        let mut first = true;
        loop {
            // What of `self.answer` is this body's, and whether it ends it.
            let (take, done) = match framing {
                Framing::Empty => (0, true),
                Framing::Length(_) => {
                    let take = usize::try_from(left)
                        .unwrap_or(usize::MAX)
                        .min(self.answer.len());
                    left -= take as u64;
                    (take, left == 0)
                }
                Framing::Chunked => match chunks.scan(&self.answer) {
                    Ok(Some(end)) => (end, true),
                    Ok(None) => (self.answer.len(), false),
                    Err(()) => return Passed::Broken,
                },
                Framing::UntilClose => (self.answer.len(), false),
            };
            if done {
                // Read whole: the server is done before the client has it.
                pick.answered();
            }
            let written = if framing == Framing::UntilClose {
                if !first {
                    self.out.clear();
                }
                chunk(&mut self.out, &self.answer[..take]);
                io.write_all(&self.out).await
            } else if first {
                self.out.extend_from_slice(&self.answer[..take]);
                io.write_all(&self.out).await
            } else {
                io.write_all(&self.answer[..take]).await
            };
            first = false;
            if written.is_err() {
                return Passed::ClientGone;
            }
            self.answer.advance(take);
            if done {
                return Passed::Whole;
            }
            self.answer.clear();
            self.answer.reserve(READ);
            // A client that leaves while the upstream is quiet (a stream,
            // a long poll) ends the answer, and the upstream connection.
            let read = unless_client_leaves(io, buf, up.read_buf(&mut self.answer)).await;
            let Some(read) = read else {
                return Passed::ClientGone;
            };
            match read {
                Ok(0) if framing == Framing::UntilClose => {
                    pick.answered();
                    if io.write_all(b"0\r\n\r\n").await.is_err() {
                        return Passed::ClientGone;
                    }
                    return Passed::Whole;
                }
                Ok(0) | Err(_) => return Passed::Broken,
                Ok(_) => {}
            }
        }
    }
}

/// How a body's streaming ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Passed {
    Whole,
    /// The client's connection failed.
    ClientGone,
    /// The upstream's answer broke off, or was not HTTP.
    Broken,
}

/// Why an upstream gave no answer head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failed {
    /// Nothing reached it: 502.
    Unavailable,
    /// The request went, no answer came: 504, the outcome unknown.
    Unknown,
    /// A 101 to a request that asked for no upgrade: 502.
    Switched,
}

/// Whether `buf` may hold a head's end (a blank line, `\n\n` or
/// `\n\r\n`, as httparse takes either) in its bytes from `from` on, the
/// three before them included.
fn head_may_end(buf: &[u8], from: usize) -> bool {
    let start = from.saturating_sub(3);
    buf.get(start..).is_some_and(|tail| {
        tail.windows(2).enumerate().any(|(i, w)| {
            w[0] == b'\n' && (w[1] == b'\n' || (w[1] == b'\r' && tail.get(i + 2) == Some(&b'\n')))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_is_parsed_once_its_blank_line_may_have_come() {
        let head = b"GET / HTTP/1.1\r\nhost: a\r\n\r\n";
        assert!(head_may_end(head, 0));
        assert!(head_may_end(b"GET / HTTP/1.1\nhost: a\n\n", 0));
        // The end came in the last byte, after bytes already scanned.
        assert!(head_may_end(head, head.len() - 1));
        for cut in 0..head.len() - 1 {
            assert!(!head_may_end(&head[..cut], 0), "{cut}");
        }
    }

    #[test]
    fn header_kinds_are_told_in_any_case() {
        assert!(kind("Transfer-Encoding") == Kind::TransferEncoding);
        assert!(kind("X-FORWARDED-FOR") == Kind::XForwardedFor);
        assert!(kind("x-forwarded-proto") == Kind::XForwardedOwn);
        assert!(kind("Proxy-Connection") == Kind::HopByHop);
        assert!(kind("TE") == Kind::HopByHop);
        assert!(kind("Host") == Kind::Host);
        assert!(kind("x-request-id") == Kind::RequestId);
        assert!(kind("ACCEPT") == Kind::Accept);
        assert!(kind("Origin") == Kind::Origin);
        assert!(kind("Expect") == Kind::Expect);
        assert!(kind("x-forwarded-fox") == Kind::Other);
        assert!(kind("hostx") == Kind::Other);
    }
}
