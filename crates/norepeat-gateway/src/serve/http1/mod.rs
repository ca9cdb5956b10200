// Over 400 lines on purpose: one HTTP/1.1 codec (framing, chunked bodies, an answer written as hyper writes it) and its table tests, which read best beside the code.
//! HTTP/1.1 by hand: the framing of an answer (RFC 9112 §6.3), a chunked
//! body told and decoded as its bytes come (§7.1), the hop-by-hop names
//! (RFC 9110 §7.6.1), and an answer written to the client as hyper's
//! server writes it ([`write_answer`]). The pass-through's lane
//! (`listen/lane.rs`, `listen/routed.rs`) and the routes' hand-written
//! upstream exchange (`upstream/exchange.rs`) speak it: no task per
//! connection and no channel to one, as hyper's client has (its
//! connection task was a fifth of a guarded request's instructions;
//! BENCHMARKS.md, issue 39). A request whose body is still coming, an
//! upgrade and an `https://` upstream stay hyper's.

use axum::body::Body;
use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderName, Response, StatusCode};
use http_body::Frame;
use std::pin::Pin;
use std::task::Poll;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// An `Upgrade` protocol's name, without its version, in lower case
/// (`WebSocket/13` is `websocket`): what `upgrades` lists and a 101 is
/// matched by.
pub(crate) fn protocol_name(protocol: &str) -> String {
    protocol
        .split('/')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// The headers RFC 9110 §7.6.1 names as hop-by-hop (plus the
/// long-standing `Keep-Alive` and `Proxy-Connection`), `Connection` first.
/// Names, not strings: a `&str` is parsed into a name on every call, and
/// this runs twice per request (BENCHMARKS.md, issue 39).
pub(crate) static HOP_BY_HOP: [HeaderName; 7] = [
    http::header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    http::header::TE,
    http::header::TRAILER,
    http::header::TRANSFER_ENCODING,
    http::header::UPGRADE,
];

/// Where `name` (in any case) is in [`HOP_BY_HOP`]: told by its length
/// and text, which costs less than comparing it with each of them.
pub(crate) fn hop_by_hop_index(name: &str) -> Option<usize> {
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

/// What a read asks for at least.
pub(crate) const READ: usize = 8 * 1024;
/// An answer's head longer than this, or with more headers, is a broken
/// answer (hyper's client limits alike).
pub(crate) const MAX_ANSWER_HEAD: usize = 64 * 1024;
pub(crate) const ANSWER_HEADERS: usize = 100;

/// How an answer's body ends (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    Empty,
    Length(u64),
    Chunked,
    /// Until the upstream closes: chunked by the lane for the client.
    UntilClose,
}

/// What an answer's head says of its body and its connection.
pub(crate) struct AnswerFraming<'h> {
    pub(crate) framing: Framing,
    /// The connection may carry a next request once the body has ended.
    pub(crate) reusable: bool,
    /// `Transfer-Encoding` as the upstream wrote it (empty: none).
    pub(crate) codings: &'h [u8],
    /// The names its `Connection` lists (hop-by-hop too).
    pub(crate) named: [&'h [u8]; 8],
    pub(crate) names: usize,
}

impl AnswerFraming<'_> {
    /// Whether `name` is one of the hop-by-hop headers of this answer: the
    /// fixed ones and those its `Connection` names.
    pub(crate) fn is_hop_by_hop(&self, name: &str) -> bool {
        hop_by_hop_index(name).is_some()
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
pub(crate) fn answer_framing<'h>(
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
pub(crate) fn header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Appends `data` as one chunk (RFC 9112 §7.1): nothing for no data, as
/// an empty chunk would end the body.
pub(crate) fn chunk(out: &mut Vec<u8>, data: &[u8]) {
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
pub(crate) fn content_length(value: &[u8]) -> Option<u64> {
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
pub(crate) fn hex_len(mut n: usize, buf: &mut [u8; 16]) -> &[u8] {
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
pub(crate) struct Chunks {
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
pub(crate) enum Decoded {
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
    pub(crate) fn scan(&mut self, bytes: &[u8]) -> Result<Option<usize>, ()> {
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
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, ()> {
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

/// The largest body the exchange takes whole (a larger one streams, by
/// hyper's client).
pub(crate) const IN_HAND: u64 = 64 * 1024;

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
pub(crate) async fn write_answer<S>(
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
    // The upstream's own phrase when it had one (`upstream/exchange.rs` keeps it).
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
pub(crate) fn now_as_http_date(with: impl FnOnce(&[u8])) {
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
pub(crate) async fn unless_client_leaves<S, F>(
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
