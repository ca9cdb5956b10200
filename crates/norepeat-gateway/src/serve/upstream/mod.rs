// Over 400 lines on purpose: the upstream call (`forward`) with its upgrade splice and read-ahead body, and the tests of the folder's headers and bodies, which share its helpers.
//! The upstream phase: a request sent to its upstream and its answer
//! brought back ([`forward`]): over the pooled connections of
//! [`pool`] (by hand, [`exchange`], for a request whose body is in hand;
//! by hyper's client for the others), with the headers [`headers`] makes
//! (hop-by-hop dropped both ways, RFC 9110 §7.6.1; `X-Forwarded-*` and
//! `Forwarded` added; `Host` kept), streamed bodies both ways, and an
//! HTTP/1.1 `Upgrade` the file allows spliced through once the upstream
//! answers 101 to it.

pub(crate) mod balance;
pub(crate) mod exchange;
pub(crate) mod headers;
pub(crate) mod lookup;
pub(crate) mod pause;
pub(crate) mod pool;

use crate::serve::http1::protocol_name;
use axum::body::Body;
use axum::extract::ConnectInfo;
use bytes::Bytes;
use headers::{Forwarding, strip_hop_by_hop};
use http::{HeaderValue, Request, Response, Version, header};
use http_body::{Frame, SizeHint};
use hyper_util::rt::TokioIo;
use pool::{Client, Secure, SendError};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

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
/// pass-through's lane before the request was made, `listen/routed.rs`). It
/// cannot stall or break on its way, so the upstream's `timeout` counts
/// from the call, as for a request without a body, with no [`Sent`] to
/// watch it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyInHand;

/// What became of a request body on its way to the upstream.
struct Sent {
    /// When its last piece went (or the request started): the upstream's
    /// `timeout` counts from here, so a slow upload is the client's time,
    /// not the backend's.
    last: std::sync::Mutex<tokio::time::Instant>,
    /// The body waits on the client: its last poll found no piece yet.
    /// That pause is the client's time (bounded by `body_timeout`), not
    /// the backend's: it does not count toward the upstream's `timeout`.
    waiting: std::sync::atomic::AtomicBool,
    /// The client's body failed while it was read.
    broke: std::sync::atomic::AtomicBool,
}

impl Sent {
    fn new() -> Self {
        Self {
            last: std::sync::Mutex::new(tokio::time::Instant::now()),
            waiting: std::sync::atomic::AtomicBool::new(false),
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

    /// Resolves once `timeout` has passed since the body last moved,
    /// not counting the time it waits on the client: a client that
    /// pauses mid-upload longer than the route's `timeout` (but within
    /// `body_timeout`) is not the backend's timeout. Before, a pause of
    /// 1.6 s on a route of `timeout: 1s` was a 504 and an unknown outcome,
    /// and the backend saw its request cut half-way.
    async fn quiet_for(&self, timeout: Duration) {
        loop {
            let until = self.last() + timeout;
            tokio::time::sleep_until(until).await;
            if self.waiting.load(std::sync::atomic::Ordering::Acquire) {
                // The client's turn: look again a `timeout` from now.
                tokio::time::sleep(timeout).await;
                continue;
            }
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
        let waiting = polled.is_pending();
        match &polled {
            Poll::Ready(Some(Err(_))) => {
                self.sent
                    .broke
                    .store(true, std::sync::atomic::Ordering::Release);
            }
            Poll::Ready(_) => self.sent.progress(),
            Poll::Pending => {}
        }
        self.sent
            .waiting
            .store(waiting, std::sync::atomic::Ordering::Release);
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
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
        Some(idle) => Body::new(pause::PauseLimited::new(body, idle)),
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
    let Some(to) = res
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .map(protocol_name)
    else {
        return false;
    };
    asked
        .to_str()
        .is_ok_and(|a| a.split(',').any(|p| protocol_name(p) == to))
}

/// The upstream's 101 passed to the client (its hop-by-hop headers
/// dropped but `Upgrade` and `Connection: upgrade`), and both connections
/// spliced once each side is handed over: bytes are copied both ways
/// until either side closes. The client's side is held to
/// `limits.idle_timeout` without a byte either way (see `listen::connection`).
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
    use super::headers::{add_forwarded, strip_hop_by_hop};
    use super::pool::{InHand, connect_timeout, in_hand};
    use super::{Broken, ReadAhead, read_ahead};
    use crate::serve::http1::{HOP_BY_HOP, hop_by_hop_index};
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
