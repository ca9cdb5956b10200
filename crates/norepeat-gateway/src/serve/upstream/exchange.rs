//! One HTTP/1.1 exchange with an upstream written by hand: the request's
//! head and its body (in hand, whole) in one write, the answer's head
//! parsed and its body streamed from the connection, which goes back to
//! its pool once that body has ended.

use crate::serve::http1::{
    ANSWER_HEADERS, Chunks, Decoded, Framing, IN_HAND, MAX_ANSWER_HEAD, READ, answer_framing,
    header,
};
use axum::body::Body;
use bytes::Bytes;
use bytes::{Buf, BytesMut};
use http::StatusCode;
use http::{HeaderName, HeaderValue, Request, Response};
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Why an upstream exchange has no answer.
#[derive(Debug)]
pub(crate) enum Failed {
    /// Nothing reached the upstream: no connection, or one that was found
    /// closed before a byte of the request left (only a new one is).
    Unavailable,
    /// The request went (or may have gone) and no answer head came.
    Unknown(std::io::Error),
    /// The request went and a 101 came, which it did not ask for.
    Switched,
}

impl From<std::io::Error> for Failed {
    fn from(e: std::io::Error) -> Self {
        Failed::Unknown(e)
    }
}

fn broken(what: &'static str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what)
}

/// The idle connections a [`Streamed`] body gives its connection back to.
pub(crate) type Idle = Arc<dyn Fn(TcpStream) + Send + Sync>;

/// Sends `req`'s head for `target` and `body` (in hand, whole) on `up`,
/// an idle connection from the pool, or on a new one from `connect` (when
/// there is none, or the idle one was found closed before a byte of the
/// request left), then reads the answer's head: the answer, its body
/// streamed from the connection, which goes back through `idle` once that
/// body has ended.
///
/// # Errors
/// [`Failed`]: whether anything reached the upstream.
pub(crate) async fn exchange<F, Fut>(
    up: Option<TcpStream>,
    connect: F,
    (mut req, forwarding): (
        http::request::Parts,
        &crate::serve::upstream::headers::Forwarding,
    ),
    target: &[u8],
    body: Bytes,
    idle: Idle,
) -> Result<Response<Body>, Failed>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = std::io::Result<TcpStream>>,
{
    let head = req.method == http::Method::HEAD;
    let mut out = Vec::with_capacity(512 + body.len());
    out.extend_from_slice(req.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target);
    out.extend_from_slice(b" HTTP/1.1\r\n");
    forwarding.write(&mut req.headers, &mut out);
    // The body's own length: what hyper's client writes for a body whose
    // size it knows (none for a bodiless GET, HEAD, DELETE...).
    let declared = req.headers.contains_key(http::header::CONTENT_LENGTH);
    let with_body = matches!(
        req.method,
        http::Method::POST | http::Method::PUT | http::Method::PATCH
    );
    if !body.is_empty() || declared || with_body {
        let mut n = itoa::Buffer::new();
        header(&mut out, b"content-length", n.format(body.len()).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&body);

    let mut up = match up {
        Some(reused) => {
            let mut reused = reused;
            match reused.write(&out).await {
                // Closed before a byte left: a new connection, once.
                Ok(0) | Err(_) => None,
                Ok(n) => {
                    reused.write_all(&out[n..]).await?;
                    Some(reused)
                }
            }
        }
        None => None,
    };
    if up.is_none() {
        let mut fresh = connect().await.map_err(|_| Failed::Unavailable)?;
        match fresh.write(&out).await {
            Ok(0) | Err(_) => return Err(Failed::Unavailable),
            Ok(n) => fresh.write_all(&out[n..]).await?,
        }
        up = Some(fresh);
    }
    let Some(mut up) = up else {
        return Err(Failed::Unavailable);
    };

    let mut buf = BytesMut::with_capacity(READ);
    loop {
        if !buf.is_empty() {
            let mut headers = [httparse::EMPTY_HEADER; ANSWER_HEADERS];
            let mut parsed = httparse::Response::new(&mut headers);
            match parsed.parse(&buf) {
                Ok(httparse::Status::Complete(len)) => {
                    let (Some(version), Some(code)) = (parsed.version, parsed.code) else {
                        return Err(broken("an answer without a status").into());
                    };
                    if (100..200).contains(&code) {
                        // 101 was not asked for (an upgrade is hyper's).
                        if code == 101 {
                            return Err(Failed::Switched);
                        }
                        buf.advance(len);
                        continue;
                    }
                    let framing = answer_framing(head, code, version, parsed.headers)
                        .map_err(|()| broken("an answer whose body cannot be framed"))?;
                    let status =
                        StatusCode::from_u16(code).map_err(|_| broken("an invalid status"))?;
                    let mut res = Response::new(Body::empty());
                    *res.status_mut() = status;
                    if let Some(reason) = parsed.reason
                        && status.canonical_reason() != Some(reason)
                        && let Ok(r) = hyper::ext::ReasonPhrase::try_from(reason.as_bytes())
                    {
                        res.extensions_mut().insert(r);
                    }
                    let map = res.headers_mut();
                    map.reserve(parsed.headers.len());
                    for h in parsed.headers.iter() {
                        // A length beside a transfer coding is not the body's;
                        // the hop-by-hop headers are this connection's (left
                        // out here, `upstream` finds none to strip).
                        if (!framing.codings.is_empty()
                            && h.name.eq_ignore_ascii_case("content-length"))
                            || framing.is_hop_by_hop(h.name)
                        {
                            continue;
                        }
                        let name = HeaderName::from_bytes(h.name.as_bytes())
                            .map_err(|_| broken("an invalid header name"))?;
                        let value = HeaderValue::from_bytes(h.value)
                            .map_err(|_| broken("an invalid header value"))?;
                        map.append(name, value);
                    }
                    let reusable = framing.reusable;
                    let framing = framing.framing;
                    buf.advance(len);
                    let mut body = Streamed {
                        up: Some(up),
                        buf,
                        framing,
                        left: match framing {
                            Framing::Length(n) => n,
                            _ => 0,
                        },
                        chunks: Chunks::default(),
                        reusable,
                        idle,
                        done: false,
                    };
                    if framing == Framing::Empty {
                        body.finish();
                    }
                    *res.body_mut() = Body::new(body);
                    return Ok(res);
                }
                Ok(httparse::Status::Partial) if buf.len() < MAX_ANSWER_HEAD => {}
                Ok(httparse::Status::Partial) | Err(_) => {
                    return Err(broken("an answer head past its limits or malformed").into());
                }
            }
        }
        buf.reserve(READ);
        if up.read_buf(&mut buf).await? == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
    }
}

/// An answer's body, read from its connection as the client takes it; the
/// connection goes back to the idle ones once the body has ended (a body
/// dropped before closes it).
pub(crate) struct Streamed {
    up: Option<TcpStream>,
    buf: BytesMut,
    framing: Framing,
    /// What is left of a body of known length.
    left: u64,
    chunks: Chunks,
    reusable: bool,
    idle: Idle,
    done: bool,
}

impl Streamed {
    fn finish(&mut self) {
        self.done = true;
        if let Some(up) = self.up.take()
            && self.reusable
            && self.buf.is_empty()
        {
            (self.idle)(up);
        }
    }
}

impl http_body::Body for Streamed {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = &mut *self;
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            if !this.buf.is_empty() {
                match this.framing {
                    Framing::Empty => {
                        this.finish();
                        return Poll::Ready(None);
                    }
                    Framing::Length(_) => {
                        let take = usize::try_from(this.left)
                            .unwrap_or(usize::MAX)
                            .min(this.buf.len());
                        this.left -= take as u64;
                        let data = this.buf.split_to(take).freeze();
                        if this.left == 0 {
                            this.finish();
                        }
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    Framing::Chunked => match this.chunks.decode(&mut this.buf) {
                        Ok(Decoded::Data(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                        Ok(Decoded::End) => {
                            this.finish();
                            return Poll::Ready(None);
                        }
                        Ok(Decoded::More) => {}
                        Err(()) => {
                            this.up = None;
                            this.done = true;
                            return Poll::Ready(Some(Err(broken("a malformed chunked body"))));
                        }
                    },
                    Framing::UntilClose => {
                        let data = this.buf.split().freeze();
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                }
            }
            let Some(up) = this.up.as_mut() else {
                return Poll::Ready(None);
            };
            this.buf.reserve(READ);
            match tokio_util::io::poll_read_buf(Pin::new(up), cx, &mut this.buf) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) if this.framing == Framing::UntilClose => {
                    this.up = None;
                    this.done = true;
                    return Poll::Ready(None);
                }
                Poll::Ready(Ok(0)) => {
                    this.up = None;
                    this.done = true;
                    return Poll::Ready(Some(Err(std::io::ErrorKind::UnexpectedEof.into())));
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => {
                    this.up = None;
                    this.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Length(_) => SizeHint::with_exact(self.left),
            Framing::Empty => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

/// A request whose body is in hand, or why not: hyper's client takes
/// the others.
pub(crate) fn body_in_hand(req: &Request<Body>) -> bool {
    http_body::Body::size_hint(req.body())
        .exact()
        .is_some_and(|n| n <= IN_HAND)
}
