//! Forwarding written by us: one pooled hyper-util client, streamed bodies
//! both ways, hop-by-hop headers dropped both ways (RFC 9110 §7.6.1), the
//! `X-Forwarded-*` and `Forwarded` headers added, `Host` kept.

use axum::body::Body;
use axum::extract::ConnectInfo;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, Uri, Version, header};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// The pooled HTTP/1.1 client every route shares.
pub(crate) type HttpClient = Client<HttpConnector, Body>;

/// The longest a connection attempt may take.
const MAX_CONNECT: Duration = Duration::from_secs(5);

/// How long a route whose answer must come within `timeout` lets a
/// connection attempt take: half of it (at most 5 s), so a backend that
/// silently drops connection attempts is a connect error (502: nothing
/// reached it, the key is released) before the route's timeout makes it
/// an unknown outcome (504).
#[must_use]
pub(crate) fn connect_timeout(timeout: Duration) -> Duration {
    (timeout / 2).min(MAX_CONNECT)
}

/// A client with a pool of idle connections per upstream, giving up on a
/// connection attempt after `connect`.
#[must_use]
pub(crate) fn client(connect: Duration) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(connect));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector)
}

/// Why no answer came from the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The connection could not be made: nothing reached the backend.
    Unavailable,
    /// No answer within the timeout, or the connection broke after the
    /// request was sent: the outcome is unknown.
    Timeout,
}

/// The headers RFC 9110 §7.6.1 names as hop-by-hop (plus the
/// long-standing `Keep-Alive` and `Proxy-Connection`).
const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Drops the hop-by-hop headers: the fixed ones, and every header that
/// `Connection` names.
///
/// ```
/// use http::HeaderMap;
/// let mut h = HeaderMap::new();
/// h.insert("connection", "close, x-secret".parse().unwrap());
/// h.insert("x-secret", "1".parse().unwrap());
/// h.insert("keep-alive", "timeout=5".parse().unwrap());
/// h.insert("x-kept", "1".parse().unwrap());
/// norepeat_gateway::serve::strip_hop_by_hop(&mut h);
/// assert_eq!(h.len(), 1);
/// assert!(h.contains_key("x-kept"));
/// ```
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        headers.remove(n);
    }
    for n in HOP_BY_HOP {
        headers.remove(n);
    }
}

/// Adds `X-Forwarded-For` (appended to the client's), `X-Forwarded-Proto`,
/// `X-Forwarded-Host` and `Forwarded` (appended), for a request from `peer`.
fn add_forwarded(headers: &mut HeaderMap, peer: Option<IpAddr>, host: Option<HeaderValue>) {
    let Some(peer) = peer else { return };
    let ip = peer.to_string();
    let earlier: Vec<String> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_owned))
        .collect();
    let xff = if earlier.is_empty() {
        ip.clone()
    } else {
        format!("{}, {ip}", earlier.join(", "))
    };
    if let Ok(v) = HeaderValue::from_str(&xff) {
        headers.insert("x-forwarded-for", v);
    }
    headers.insert("x-forwarded-proto", HeaderValue::from_static("http"));
    let node = match peer {
        IpAddr::V4(_) => ip,
        IpAddr::V6(_) => format!("\"[{ip}]\""),
    };
    let mut forwarded = format!("for={node};proto=http");
    if let Some(host) = host {
        if let Ok(h) = host.to_str()
            && !h.contains('"')
        {
            forwarded.push_str(&format!(";host=\"{h}\""));
        }
        headers.insert("x-forwarded-host", host);
    }
    if let Ok(v) = HeaderValue::from_str(&forwarded) {
        headers.append(header::FORWARDED, v);
    }
}

/// Sends `req` to `upstream` (`http://host:port[/base]`): the head must
/// come within `timeout`, the bodies stream both ways. With `idle`, the
/// answer's body fails once no frame has come for that long: a guarded
/// route's layer then records what it has (the status, without the body)
/// instead of waiting, and holding its key, for a backend that stalls.
///
/// # Errors
/// [`Failure::Unavailable`] when nothing reached the backend,
/// [`Failure::Timeout`] when the outcome is unknown.
pub(crate) async fn forward(
    client: &HttpClient,
    upstream: &str,
    timeout: Duration,
    idle: Option<Duration>,
    mut req: Request<Body>,
) -> Result<Response<Body>, Failure> {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let pq = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let uri: Uri = format!("{upstream}{pq}")
        .parse()
        .map_err(|_| Failure::Unavailable)?;
    // HTTP/2 carries the host in the URI: keep it as the client sent it.
    let host = match req.headers().get(header::HOST) {
        Some(h) => Some(h.clone()),
        None => req
            .uri()
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok()),
    };
    *req.uri_mut() = uri;
    *req.version_mut() = Version::HTTP_11;
    let headers = req.headers_mut();
    strip_hop_by_hop(headers);
    add_forwarded(headers, peer, host.clone());
    if let Some(h) = host {
        headers.insert(header::HOST, h);
    }
    let res = match tokio::time::timeout(timeout, client.request(req)).await {
        Err(_) => return Err(Failure::Timeout),
        Ok(Err(e)) if e.is_connect() => return Err(Failure::Unavailable),
        Ok(Err(_)) => return Err(Failure::Timeout),
        Ok(Ok(res)) => res,
    };
    let (mut parts, body) = res.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let body = match idle {
        Some(idle) => Body::new(tower_http::timeout::TimeoutBody::new(idle, body)),
        None => Body::new(body),
    };
    Ok(Response::from_parts(parts, body))
}

#[cfg(test)]
mod tests {
    use super::connect_timeout;
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
