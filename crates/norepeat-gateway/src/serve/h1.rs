//! HTTP/1.1 by hand. Over plain upstream connections: the framing of an
//! answer (RFC 9112 §6.3), a chunked body told and decoded as its bytes
//! come (§7.1), and the exchange of a request whose body is in hand
//! ([`exchange`]) with its answer's body streamed from the connection
//! ([`Streamed`]). To the client: an answer written as hyper's server
//! writes it ([`write_answer`]). The pass-through's lane (`passthrough.rs`,
//! `routed.rs`) and the routes' upstream stage (`forward.rs`) speak it: no
//! task per connection and no channel to one, as hyper's client has (its
//! connection task was a fifth of a guarded request's instructions;
//! BENCHMARKS.md, issue 39). A request whose body is still coming, an
//! upgrade and an `https://` upstream stay hyper's.

use axum::body::Body;
use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// What a read asks for at least.
pub(super) const READ: usize = 8 * 1024;
/// An answer's head longer than this, or with more headers, is a broken
/// answer (hyper's client limits alike).
pub(super) const MAX_ANSWER_HEAD: usize = 64 * 1024;
pub(super) const ANSWER_HEADERS: usize = 100;

/// How an answer's body ends (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    Empty,
    Length(u64),
    Chunked,
    /// Until the upstream closes: chunked by the lane for the client.
    UntilClose,
}

/// What an answer's head says of its body and its connection.
pub(super) struct AnswerFraming<'h> {
    pub(super) framing: Framing,
    /// The connection may carry a next request once the body has ended.
    pub(super) reusable: bool,
    /// `Transfer-Encoding` as the upstream wrote it (empty: none).
    pub(super) codings: &'h [u8],
    /// The names its `Connection` lists (hop-by-hop too).
    pub(super) named: [&'h [u8]; 8],
    pub(super) names: usize,
}

impl AnswerFraming<'_> {
    /// Whether `name` is one of the hop-by-hop headers of this answer: the
    /// fixed ones and those its `Connection` names.
    pub(super) fn is_hop_by_hop(&self, name: &str) -> bool {
        super::forward::hop_by_hop_index(name).is_some()
            || self.named[..self.names]
                .iter()
                .any(|n| name.as_bytes().eq_ignore_ascii_case(n))
    }
}

/// The framing of an answer with `status` and `headers` (`version`: 1 for
/// HTTP/1.1, 0 for 1.0) to a request that was a `HEAD` or not.
///
/// # Errors
/// Lengths that disagree or are not numbers, several `Transfer-Encoding`
/// fields, a `Connection` naming more than 8 headers: not followed.
pub(super) fn answer_framing<'h>(
    head: bool,
    status: u16,
    version: u8,
    headers: &[httparse::Header<'h>],
) -> Result<AnswerFraming<'h>, ()> {
    let mut named: [&[u8]; 8] = [b""; 8];
    let mut names = 0;
    let mut reusable = version == 1;
    let mut length: Option<u64> = None;
    let mut chunked = None;
    let mut codings: &[u8] = b"";
    for h in headers {
        if h.name.eq_ignore_ascii_case("connection") {
            for token in h.value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                if token.eq_ignore_ascii_case(b"close") {
                    reusable = false;
                } else if !token.is_empty() && !token.eq_ignore_ascii_case(b"keep-alive") {
                    *named.get_mut(names).ok_or(())? = token;
                    names += 1;
                }
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            // The last coding is what frames the body: chunked, or none
            // that tells its end (then it ends with the connection).
            // Several fields are one list to hyper's client; a backend
            // that splits them is not followed.
            // An empty one frames nothing: not followed either.
            if chunked.is_some() || h.value.trim_ascii().is_empty() {
                return Err(());
            }
            let last = h
                .value
                .rsplit(|&b| b == b',')
                .next()
                .map(<[u8]>::trim_ascii);
            chunked = Some(last.is_some_and(|c| c.eq_ignore_ascii_case(b"chunked")));
            codings = h.value;
        } else if h.name.eq_ignore_ascii_case("content-length") {
            for v in h.value.split(|&b| b == b',') {
                let n = content_length(v).ok_or(())?;
                // Several lengths must agree (RFC 9112 §6.3).
                if length.is_some_and(|l| l != n) {
                    return Err(());
                }
                length = Some(n);
            }
        }
    }
    let framing = if head || status == 204 || status == 304 {
        Framing::Empty
    } else {
        match (chunked, length) {
            (Some(true), _) => Framing::Chunked,
            (Some(false), _) | (None, None) => {
                reusable = false;
                Framing::UntilClose
            }
            (None, Some(0)) => Framing::Empty,
            (None, Some(n)) => Framing::Length(n),
        }
    };
    Ok(AnswerFraming {
        framing,
        reusable,
        codings,
        named,
        names,
    })
}

/// `name: value` and its line end.
pub(super) fn header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Appends `data` as one chunk (RFC 9112 §7.1): nothing for no data, as
/// an empty chunk would end the body.
pub(super) fn chunk(out: &mut Vec<u8>, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    let mut size = [0u8; 16];
    out.extend_from_slice(hex_len(data.len(), &mut size));
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// A `Content-Length` value (RFC 9110 §8.6): digits only, blanks around
/// them aside, that fit a `u64`; anything else is no length.
pub(super) fn content_length(value: &[u8]) -> Option<u64> {
    let digits = value.trim_ascii();
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        if d.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        } else {
            None
        }
    })
}

/// `n` in hexadecimal digits, in `buf`.
pub(super) fn hex_len(mut n: usize, buf: &mut [u8; 16]) -> &[u8] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = DIGITS[n & 0xf];
        n >>= 4;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// Where a chunked body ends (RFC 9112 §7.1), told from its bytes as they
/// come: the sizes, the data, the last chunk and the trailer section.
#[derive(Debug, Default)]
pub(super) struct Chunks {
    state: ChunkState,
    /// The current chunk's size, then what is left of its data.
    size: u64,
    digits: u8,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    #[default]
    Size,
    /// A chunk extension, to its line end.
    Extension,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    /// The start of a trailer line, or of the blank line that ends all.
    TrailerStart,
    Trailer,
    TrailerLf,
    EndLf,
    Done,
}

/// `b` is the byte a chunked body has there, or the body is broken.
fn expect(b: u8, want: u8) -> Result<(), ()> {
    if b == want { Ok(()) } else { Err(()) }
}

/// What [`Chunks::decode`] found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Decoded {
    /// A chunk's data (or a part of it).
    Data(Bytes),
    /// More bytes are needed.
    More,
    /// The body has ended (its trailers are dropped).
    End,
}

impl Chunks {
    /// One byte outside a chunk's data. `true`: the body ended with it.
    fn step(&mut self, b: u8) -> Result<bool, ()> {
        match self.state {
            ChunkState::Size => match b {
                b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                    if self.digits == 16 {
                        return Err(());
                    }
                    let d = char::from(b).to_digit(16).ok_or(())?;
                    self.size = self.size << 4 | u64::from(d);
                    self.digits += 1;
                }
                b';' | b' ' | b'\t' if self.digits > 0 => self.state = ChunkState::Extension,
                b'\r' if self.digits > 0 => self.state = ChunkState::SizeLf,
                _ => return Err(()),
            },
            ChunkState::Extension => match b {
                b'\r' => self.state = ChunkState::SizeLf,
                b'\t' | b' '..=b'~' | 0x80..=0xff => {}
                _ => return Err(()),
            },
            ChunkState::SizeLf => {
                expect(b, b'\n')?;
                self.digits = 0;
                self.state = if self.size == 0 {
                    ChunkState::TrailerStart
                } else {
                    ChunkState::Data
                };
            }
            ChunkState::DataCr => {
                expect(b, b'\r')?;
                self.state = ChunkState::DataLf;
            }
            ChunkState::DataLf => {
                expect(b, b'\n')?;
                self.state = ChunkState::Size;
            }
            ChunkState::TrailerStart => {
                self.state = if b == b'\r' {
                    ChunkState::EndLf
                } else {
                    ChunkState::Trailer
                };
            }
            ChunkState::Trailer => match b {
                b'\r' => self.state = ChunkState::TrailerLf,
                b'\t' | b' '..=b'~' | 0x80..=0xff => {}
                _ => return Err(()),
            },
            ChunkState::TrailerLf => {
                expect(b, b'\n')?;
                self.state = ChunkState::TrailerStart;
            }
            ChunkState::EndLf => {
                expect(b, b'\n')?;
                self.state = ChunkState::Done;
                return Ok(true);
            }
            // Data is the callers'; nothing follows the end.
            ChunkState::Data | ChunkState::Done => return Err(()),
        }
        Ok(false)
    }

    /// How many of `available` data bytes are the current chunk's (the
    /// chunk's data then ends when they are all of it).
    fn data(&mut self, available: usize) -> usize {
        let take = usize::try_from(self.size)
            .unwrap_or(usize::MAX)
            .min(available);
        self.size -= take as u64;
        if self.size == 0 {
            self.state = ChunkState::DataCr;
        }
        take
    }

    /// Scans `bytes`, which follow those scanned before: `Some(n)` when
    /// the body ends after the first `n` of them.
    ///
    /// # Errors
    /// The bytes are not a chunked body.
    pub(super) fn scan(&mut self, bytes: &[u8]) -> Result<Option<usize>, ()> {
        let mut i = 0;
        while i < bytes.len() {
            if self.state == ChunkState::Data {
                i += self.data(bytes.len() - i);
                continue;
            }
            if self.step(bytes[i])? {
                return Ok(Some(i + 1));
            }
            i += 1;
        }
        Ok(None)
    }

    /// Takes from `buf` what of the body it holds: the next data, or
    /// that more is needed, or the end.
    ///
    /// # Errors
    /// The bytes are not a chunked body.
    pub(super) fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, ()> {
        loop {
            if self.state == ChunkState::Done {
                return Ok(Decoded::End);
            }
            if buf.is_empty() {
                return Ok(Decoded::More);
            }
            if self.state == ChunkState::Data {
                let take = self.data(buf.len());
                return Ok(Decoded::Data(buf.split_to(take).freeze()));
            }
            let b = buf[0];
            buf.advance(1);
            if self.step(b)? {
                return Ok(Decoded::End);
            }
        }
    }
}

/// Why an upstream exchange has no answer.
#[derive(Debug)]
pub(super) enum Failed {
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
pub(super) type Idle = Arc<dyn Fn(TcpStream) + Send + Sync>;

/// Sends `req`'s head for `target` and `body` (in hand, whole) on `up`,
/// an idle connection from the pool, or on a new one from `connect` (when
/// there is none, or the idle one was found closed before a byte of the
/// request left), then reads the answer's head: the answer, its body
/// streamed from the connection, which goes back through `idle` once that
/// body has ended.
///
/// # Errors
/// [`Failed`]: whether anything reached the upstream.
pub(super) async fn exchange<F, Fut>(
    up: Option<TcpStream>,
    connect: F,
    (mut req, forwarding): (http::request::Parts, &super::forward::Forwarding),
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
                        // out here, `forward` finds none to strip).
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
pub(super) struct Streamed {
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
pub(super) fn body_in_hand(req: &Request<Body>) -> bool {
    http_body::Body::size_hint(req.body())
        .exact()
        .is_some_and(|n| n <= IN_HAND)
}

/// The largest body the exchange takes whole (a larger one streams, by
/// hyper's client).
pub(super) const IN_HAND: u64 = 64 * 1024;

/// The most of an answer's body gathered before a write.
const GATHER: usize = 64 * 1024;

/// Writes `res` to the client's `io` as hyper's server writes an answer
/// (a route's, or one of the gateway's own: 400, 502, 504): its headers
/// as they are but its framing's (a `Content-Length` its body or its
/// header gives, else chunked), a `Date` when it has none, and
/// `Connection: close` when the connection closes after it; a `HEAD`'s
/// (`head`) without its body. The head and the body's first pieces go in
/// one write, gathered in `out`. While the body is quiet the client is
/// watched through `buf`, its read buffer ([`unless_client_leaves`]).
/// `false`: the connection is to be closed (asked for, the client gone,
/// or the body broke off).
pub(super) async fn write_answer<S>(
    (io, buf): (&mut S, &mut BytesMut),
    out: &mut Vec<u8>,
    res: Response<Body>,
    head: bool,
    mut closing: bool,
) -> bool
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    use http_body::Body as _;
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
            match content_length(value.as_bytes()) {
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
        _ if no_body => Framing::Empty,
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
        Framing::Empty if head && given.is_none() && status != StatusCode::NOT_MODIFIED => {
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
    if framing == Framing::Empty {
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
            _ => chunk(out, &data),
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

/// Calls `with` on the current time as an HTTP date (IMF-fixdate),
/// formatted once a second per thread.
pub(super) fn now_as_http_date(with: impl FnOnce(&[u8])) {
    thread_local! {
        static DATE: std::cell::RefCell<(u64, String)> =
            const { std::cell::RefCell::new((u64::MAX, String::new())) };
    }
    let now = std::time::SystemTime::now();
    let second = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    DATE.with(|date| {
        let mut date = date.borrow_mut();
        if date.0 != second {
            *date = (second, httpdate::fmt_http_date(now));
        }
        with(date.1.as_bytes());
    });
}

/// `work`'s output, unless the client leaves first (`None`): its end of
/// the connection read while `work` waits, as hyper's server notices it.
/// Only a client with nothing of a next request in `buf` is read: bytes
/// of a pipelined request wait there, and an end read after them ends
/// those requests, not this one (hyper does not look either), so a client
/// that sends its requests and then closes its side gets the answer in
/// flight.
pub(super) async fn unless_client_leaves<S, F>(
    io: &mut S,
    buf: &mut BytesMut,
    work: F,
) -> Option<F::Output>
where
    S: AsyncRead + Unpin,
    F: std::future::Future,
{
    let mut work = std::pin::pin!(work);
    loop {
        tokio::select! {
            biased;
            out = &mut work => return Some(out),
            read = io.read_buf(buf), if buf.is_empty() => match read {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &[u8] =
        b"3;name=value\r\nabc\r\nA\r\n0123456789\r\n0\r\nx-sum: 13\r\nx-more: 1\r\n\r\n";

    /// Where [`Chunks`] says `bytes` end, fed in pieces of `piece` bytes.
    fn end_in_pieces(bytes: &[u8], piece: usize) -> Result<Option<usize>, ()> {
        let mut chunks = Chunks::default();
        let mut at = 0;
        for part in bytes.chunks(piece) {
            if let Some(end) = chunks.scan(part)? {
                return Ok(Some(at + end));
            }
            at += part.len();
        }
        Ok(None)
    }

    #[test]
    fn a_chunked_body_ends_where_its_trailers_end_however_it_is_split() {
        let mut followed = BODY.to_vec();
        followed.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        for piece in 1..=followed.len() {
            assert_eq!(
                end_in_pieces(&followed, piece),
                Ok(Some(BODY.len())),
                "{piece}"
            );
        }
        // Without trailers, and cut anywhere before its end: not yet.
        assert_eq!(end_in_pieces(b"2\r\nok\r\n0\r\n\r\n", 3), Ok(Some(12)));
        for cut in 0..BODY.len() {
            assert_eq!(end_in_pieces(&BODY[..cut], 4), Ok(None), "{cut}");
        }
    }

    #[test]
    fn what_is_not_a_chunked_body_is_told() {
        for broken in [
            &b"x\r\n"[..],
            b"\r\n",
            b"3\nabc\r\n",
            b"3\r\nabcd\r\n",
            b"3\r\nabc\r\r",
            b"11111111111111111\r\n",
            b"0\r\nx-sum: 1\n\r\n",
            b"0\r\n\r\r",
            b"3;\x01\r\nabc\r\n",
            b"0\r\nx\x00: 1\r\n\r\n",
        ] {
            assert_eq!(
                end_in_pieces(broken, 1),
                Err(()),
                "{}",
                String::from_utf8_lossy(broken)
            );
        }
    }

    /// The data [`Chunks::decode`] gives for `bytes` fed in pieces of
    /// `piece` bytes, and whether it saw the end.
    fn decoded_in_pieces(bytes: &[u8], piece: usize) -> Result<(Vec<u8>, bool), ()> {
        let mut chunks = Chunks::default();
        let mut buf = BytesMut::new();
        let mut data = Vec::new();
        for part in bytes.chunks(piece) {
            buf.extend_from_slice(part);
            loop {
                match chunks.decode(&mut buf)? {
                    Decoded::Data(d) => data.extend_from_slice(&d),
                    Decoded::More => break,
                    Decoded::End => return Ok((data, true)),
                }
            }
        }
        Ok((data, false))
    }

    #[test]
    fn a_chunked_body_decodes_to_its_data_however_it_is_split() {
        for piece in 1..=BODY.len() {
            assert_eq!(
                decoded_in_pieces(BODY, piece),
                Ok((b"abc0123456789".to_vec(), true)),
                "{piece}"
            );
        }
        assert_eq!(
            decoded_in_pieces(&BODY[..BODY.len() - 1], 5),
            Ok((b"abc0123456789".to_vec(), false))
        );
        assert_eq!(decoded_in_pieces(b"3\r\nabcd\r\n", 2), Err(()));
    }

    fn framing_of(
        head: bool,
        status: u16,
        headers: &[(&str, &[u8])],
    ) -> Result<(Framing, bool), ()> {
        let parsed: Vec<httparse::Header<'_>> = headers
            .iter()
            .map(|(name, value)| httparse::Header { name, value })
            .collect();
        answer_framing(head, status, 1, &parsed).map(|a| (a.framing, a.reusable))
    }

    /// An HTTP/1.0 answer's connection is not used again, even with
    /// `Connection: keep-alive` (a 1.0 server's persistence is its own
    /// extension, which the gateway does not count on); its framing is
    /// read as a 1.1 answer's.
    #[test]
    fn an_http_1_0_answer_ends_its_connection() {
        let headers = [
            httparse::Header {
                name: "Content-Length",
                value: b"2",
            },
            httparse::Header {
                name: "Connection",
                value: b"keep-alive",
            },
        ];
        let old = answer_framing(false, 200, 0, &headers).unwrap();
        assert_eq!((old.framing, old.reusable), (Framing::Length(2), false));
        let new = answer_framing(false, 200, 1, &headers).unwrap();
        assert_eq!((new.framing, new.reusable), (Framing::Length(2), true));
    }

    #[test]
    fn an_answer_is_framed_as_rfc_9112_says_or_not_followed() {
        let cl: &[u8] = b"2";
        assert_eq!(
            framing_of(false, 200, &[("Content-Length", cl)]),
            Ok((Framing::Length(2), true))
        );
        assert_eq!(
            framing_of(false, 200, &[("content-length", b"2, 2")]),
            Ok((Framing::Length(2), true))
        );
        assert_eq!(
            framing_of(true, 200, &[("content-length", cl)]),
            Ok((Framing::Empty, true))
        );
        assert_eq!(framing_of(false, 304, &[]), Ok((Framing::Empty, true)));
        assert_eq!(
            framing_of(
                false,
                200,
                &[
                    ("transfer-encoding", b"gzip, chunked"),
                    ("content-length", cl)
                ]
            ),
            Ok((Framing::Chunked, true))
        );
        assert_eq!(
            framing_of(false, 200, &[("transfer-encoding", b"gzip")]),
            Ok((Framing::UntilClose, false))
        );
        assert_eq!(
            framing_of(false, 200, &[]),
            Ok((Framing::UntilClose, false))
        );
        assert_eq!(
            framing_of(
                false,
                200,
                &[("connection", b"close"), ("content-length", cl)]
            ),
            Ok((Framing::Length(2), false))
        );
        for broken in [
            &[("content-length", cl), ("content-length", b"3")][..],
            &[("content-length", b"-1")],
            &[("content-length", b"")],
            &[("transfer-encoding", b"")],
            &[
                ("transfer-encoding", b"chunked"),
                ("transfer-encoding", b"chunked"),
            ],
            &[("connection", b"a, b, c, d, e, f, g, h, i")],
        ] {
            assert_eq!(framing_of(false, 200, broken), Err(()), "{broken:?}");
        }
    }

    /// A length is digits, blanks around them aside, that fit a `u64`.
    #[test]
    fn a_content_length_is_digits_only() {
        assert_eq!(content_length(b" 42 "), Some(42));
        assert_eq!(content_length(b"007"), Some(7));
        assert_eq!(content_length(b"18446744073709551615"), Some(u64::MAX));
        for bad in [
            &b""[..],
            b" ",
            b"+5",
            b"-1",
            b"5 5",
            b"0x10",
            b"1e3",
            b"18446744073709551616",
        ] {
            assert_eq!(
                content_length(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// A chunk is its size in hex, its data, each ended by CRLF; no data
    /// writes nothing (an empty chunk would end the body).
    #[test]
    fn data_is_written_as_one_chunk() {
        let mut out = Vec::new();
        chunk(&mut out, b"");
        assert!(out.is_empty());
        chunk(&mut out, &[b'x'; 26]);
        assert_eq!(out, [&b"1a\r\n"[..], &[b'x'; 26], b"\r\n"].concat());
    }

    #[test]
    fn lengths_are_written_in_hex() {
        let mut buf = [0u8; 16];
        assert_eq!(hex_len(0, &mut buf), b"0");
        assert_eq!(hex_len(255, &mut buf), b"ff");
        assert_eq!(hex_len(4096, &mut buf), b"1000");
        assert_eq!(
            hex_len(usize::MAX, &mut buf).len(),
            usize::BITS as usize / 4
        );
    }
}
