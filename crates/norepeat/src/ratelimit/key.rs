// Over 400 lines on purpose: whose quota a request spends: the key extractors (a header, the client address through trusted proxies) and their spellings' tests.
//! Whose quota a request spends: key extractors.

use crate::identity::{Identify, UserHeader};
use http::request::Parts;
use std::borrow::Cow;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// Picks the key a request is counted under (a user, an address, a route),
/// or `None` when the request carries none; the layer then answers with
/// [`missing`](ExtractKey::missing) and counts nothing.
///
/// Any `Fn(&http::request::Parts) -> Option<String>` is an extractor:
///
/// ```
/// use norepeat::ratelimit::ExtractKey;
/// let by_tenant = |p: &http::request::Parts| {
///     Some(p.headers.get("x-tenant")?.to_str().ok()?.to_owned())
/// };
/// let req = http::Request::builder().header("x-tenant", "acme").body(()).unwrap();
/// assert_eq!(by_tenant.extract_key(&req.into_parts().0).as_deref(), Some("acme"));
/// ```
pub trait ExtractKey: Send + Sync + 'static {
    /// The key, or `None` when the request has none.
    fn extract_key(&self, parts: &Parts) -> Option<String>;

    /// What a request without a key lacks; the layer answers it (default:
    /// [`MissingKey::Other`], 400 `invalid_request`).
    fn missing(&self) -> MissingKey {
        MissingKey::Other(Cow::Borrowed("The request carries no rate-limit key."))
    }
}

/// What a request without a rate-limit key lacks, from
/// [`ExtractKey::missing`]. The layer answers it; the extractor builds no
/// HTTP answer itself.
///
/// ```
/// use norepeat::ratelimit::{ByUser, ExtractKey, MissingKey};
/// assert!(matches!(ByUser::default().missing(), MissingKey::Caller(_)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKey {
    /// No caller: answered 401 `unauthenticated` with this detail.
    Caller(Cow<'static, str>),
    /// Any other key: answered 400 `invalid_request` with this detail.
    Other(Cow<'static, str>),
}

impl<F> ExtractKey for F
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    fn extract_key(&self, parts: &Parts) -> Option<String> {
        self(parts)
    }
}

/// Counts per caller, as an [`Identify`] names them (default: header
/// `X-User-Id`). A request without a caller gets 401 `unauthenticated`.
#[derive(Debug, Clone)]
pub struct ByUser<I = UserHeader> {
    identity: I,
}

impl Default for ByUser<UserHeader> {
    /// The caller from `X-User-Id`.
    fn default() -> Self {
        Self::new(UserHeader::default())
    }
}

impl<I: Identify> ByUser<I> {
    /// Counts per caller as `identity` names them.
    #[must_use]
    pub fn new(identity: I) -> Self {
        Self { identity }
    }
}

impl<I: Identify> ExtractKey for ByUser<I> {
    fn extract_key(&self, parts: &Parts) -> Option<String> {
        self.identity.identify(parts)
    }

    fn missing(&self) -> MissingKey {
        MissingKey::Caller(self.identity.missing())
    }
}

/// One quota for every request: a route's (or a service's) total.
#[derive(Debug, Clone, Copy, Default)]
pub struct Global;

impl ExtractKey for Global {
    fn extract_key(&self, _: &Parts) -> Option<String> {
        Some(String::new())
    }
}

/// Counts per method and path (`POST /flash-sale/SKU-1`): one quota for
/// each resource the layer covers, shared by every caller. The path is the
/// one the client sent, also inside a nested router
/// ([`client_path`](crate::request::client_path)).
///
/// The key space is as large as the set of paths clients send; the store
/// bounds it (memory) or expires it (every key has a TTL).
#[derive(Debug, Clone, Copy, Default)]
pub struct ByRoute;

impl ExtractKey for ByRoute {
    fn extract_key(&self, parts: &Parts) -> Option<String> {
        Some(format!(
            "{} {}",
            parts.method,
            crate::request::client_path(parts)
        ))
    }
}

/// The address of the connection's peer, put in the request's extensions by
/// the server. The library does not take axum's server side (where
/// `ConnectInfo` lives), so it cannot read `ConnectInfo`; copy it over in
/// one line:
///
/// ```
/// use axum::{Router, extract::{ConnectInfo, Request}, routing::get};
/// use norepeat::ratelimit::PeerAddr;
/// use std::net::SocketAddr;
///
/// let app: Router = Router::new()
///     .route("/", get(|| async { "hi" }))
///     .layer(axum::middleware::map_request(|mut req: Request| async move {
///         if let Some(ConnectInfo(addr)) = req.extensions().get::<ConnectInfo<SocketAddr>>().copied() {
///             req.extensions_mut().insert(PeerAddr(addr));
///         }
///         req
///     }));
/// // Serve with `app.into_make_service_with_connect_info::<SocketAddr>()`.
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerAddr(pub SocketAddr);

/// Counts per client IP address: the peer's, or, when the peer is one of
/// your trusted proxies, the one those proxies report in `X-Forwarded-For`.
///
/// `X-Forwarded-For` is read from the right (the entry appended by the
/// nearest proxy) and entries from trusted proxies are skipped; the first
/// entry that is not a trusted proxy is the client. IPv6 clients are
/// counted per /64 by default (one host usually holds a whole /64).
///
/// A request whose peer is unknown (no [`PeerAddr`] extension) gets 400
/// `invalid_request`: the extension is missing from the server's setup.
///
/// ```
/// use norepeat::ratelimit::{ByClientIp, ExtractKey, PeerAddr};
///
/// let ip = ByClientIp::new().trust_net("10.0.0.0".parse().unwrap(), 8);
/// let mut req = http::Request::builder()
///     .header("x-forwarded-for", "6.6.6.6, 203.0.113.7, 10.1.2.3")
///     .body(()).unwrap();
/// req.extensions_mut().insert(PeerAddr("10.0.0.1:4711".parse().unwrap()));
/// // 10.1.2.3 is a trusted proxy, 203.0.113.7 is the client, 6.6.6.6 is
/// // whatever the client wrote.
/// assert_eq!(ip.extract_key(&req.into_parts().0).as_deref(), Some("203.0.113.7"));
/// ```
///
/// # Deployment caveat
/// `X-Forwarded-For` is written by whoever sends the request: a client can
/// put any address in it. Only entries added by proxies you run can be
/// believed, which is why nothing is read from the header unless the peer
/// is a trusted proxy, and why the header is read from the right. List
/// exactly the proxies in front of this service (load balancer, ingress);
/// trusting a range that clients can connect from lets any client choose
/// its own key and escape its limit. If your proxies do not append to
/// `X-Forwarded-For` (or overwrite it), fix them, or key on something
/// else.
#[derive(Debug, Clone)]
pub struct ByClientIp {
    trusted: Vec<(IpAddr, u8)>,
    ipv6_prefix: u8,
}

impl Default for ByClientIp {
    fn default() -> Self {
        Self::new()
    }
}

impl ByClientIp {
    /// Trusts no proxy: the key is the peer's address.
    #[must_use]
    pub fn new() -> Self {
        Self {
            trusted: Vec::new(),
            ipv6_prefix: 64,
        }
    }

    /// Trusts the proxy at `addr`.
    #[must_use]
    pub fn trust(self, addr: IpAddr) -> Self {
        let bits = if addr.is_ipv4() { 32 } else { 128 };
        self.trust_net(addr, bits)
    }

    /// Trusts every proxy in `net/prefix_len` (for example `10.0.0.0/8`).
    #[must_use]
    pub fn trust_net(mut self, net: IpAddr, prefix_len: u8) -> Self {
        self.trusted.push((canonical(net), prefix_len));
        self
    }

    /// How many leading bits of an IPv6 client address form its key
    /// (default 64; 128 counts every address on its own).
    #[must_use]
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits.min(128);
        self
    }

    /// Whether `ip` is one of the trusted proxies (an IPv4-mapped IPv6
    /// address as its IPv4 address): a proxy whose forwarding headers may
    /// be believed, and passed on.
    ///
    /// ```
    /// use norepeat::ratelimit::ByClientIp;
    /// let ip = ByClientIp::new().trust_net("10.0.0.0".parse().unwrap(), 8);
    /// assert!(ip.is_trusted("10.1.2.3".parse().unwrap()));
    /// assert!(ip.is_trusted("::ffff:10.1.2.3".parse().unwrap()));
    /// assert!(!ip.is_trusted("203.0.113.7".parse().unwrap()));
    /// ```
    #[must_use]
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted
            .iter()
            .any(|&(net, len)| in_net(canonical(ip), net, len))
    }

    /// The client's address as this extractor sees it: the peer, or, from
    /// a trusted proxy, the rightmost `X-Forwarded-For` entry that is not
    /// a trusted proxy. `None` when the entry where the walk stops is not
    /// an address (`unknown`, `_hidden`, a bracketed IPv6 without a port,
    /// a zone id): the client is not known, and is not taken for the
    /// proxy, which would put every such client under one key.
    #[must_use]
    pub fn client_ip(&self, parts: &Parts) -> Option<IpAddr> {
        let PeerAddr(peer) = parts.extensions.get::<PeerAddr>()?;
        let mut client = canonical(peer.ip());
        if !self.is_trusted(client) {
            return Some(client);
        }
        let hops = parts
            .headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .collect::<Vec<_>>();
        for hop in hops.iter().rev() {
            // A hop we cannot read, where a trusted proxy says the client
            // is: the client is unknown (not the proxy that forwarded it).
            let ip = parse_hop(hop)?;
            client = ip;
            if !self.is_trusted(ip) {
                break;
            }
        }
        Some(client)
    }
}

impl ExtractKey for ByClientIp {
    fn extract_key(&self, parts: &Parts) -> Option<String> {
        let ip = match self.client_ip(parts)? {
            IpAddr::V6(v6) => IpAddr::V6(mask_v6(v6, self.ipv6_prefix)),
            v4 => v4,
        };
        Some(ip.to_string())
    }

    fn missing(&self) -> MissingKey {
        tracing::warn!(
            "rate limit by client IP without a PeerAddr extension: see ratelimit::PeerAddr"
        );
        MissingKey::Other(Cow::Borrowed("The client's address is unknown."))
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it maps.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// One `X-Forwarded-For` entry: an address, possibly with a port
/// (`1.2.3.4:80`, `[::1]:80`).
fn parse_hop(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim();
    hop.parse::<IpAddr>()
        .or_else(|_| hop.parse::<SocketAddr>().map(|s| s.ip()))
        .ok()
        .map(canonical)
}

fn in_net(ip: IpAddr, net: IpAddr, len: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let len = u32::from(len.min(32));
            let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => mask_v6(a, len) == mask_v6(n, len),
        _ => false,
    }
}

fn mask_v6(ip: Ipv6Addr, len: u8) -> Ipv6Addr {
    let len = u32::from(len.min(128));
    let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
    Ipv6Addr::from(u128::from(ip) & mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(peer: Option<&str>, xff: &[&str]) -> Parts {
        let mut b = http::Request::builder();
        for v in xff {
            b = b.header("x-forwarded-for", *v);
        }
        let mut req = b.body(()).unwrap();
        if let Some(p) = peer {
            req.extensions_mut().insert(PeerAddr(p.parse().unwrap()));
        }
        req.into_parts().0
    }

    fn key(e: &ByClientIp, peer: Option<&str>, xff: &[&str]) -> Option<String> {
        e.extract_key(&parts(peer, xff))
    }

    #[test]
    fn untrusted_peers_are_the_client_whatever_the_header_says() {
        let e = ByClientIp::new();
        assert_eq!(
            key(&e, Some("198.51.100.1:1"), &["1.1.1.1"]).as_deref(),
            Some("198.51.100.1")
        );
        assert_eq!(key(&e, None, &["1.1.1.1"]), None);
    }

    #[test]
    fn walks_the_header_from_the_right_past_trusted_proxies() {
        let e = ByClientIp::new()
            .trust("192.0.2.1".parse().unwrap())
            .trust_net("10.0.0.0".parse().unwrap(), 8);
        let peer = Some("192.0.2.1:443");
        // Split over two header lines, with a port and spaces.
        assert_eq!(
            key(&e, peer, &["7.7.7.7, 203.0.113.9:5555", " 10.2.3.4 "]).as_deref(),
            Some("203.0.113.9")
        );
        // Every hop trusted: the leftmost is the best we know.
        assert_eq!(key(&e, peer, &["10.0.0.9"]).as_deref(), Some("10.0.0.9"));
        // No header: the trusted peer itself.
        assert_eq!(key(&e, peer, &[]).as_deref(), Some("192.0.2.1"));
        // An entry that is not an address where the client should be: no
        // client (before: the trusted proxy's own address, so every such
        // client shared one key).
        for garbage in ["unknown", "_hidden", "[2001:db8::1]", "fe80::1%eth0"] {
            assert_eq!(
                key(&e, peer, &[&format!("1.2.3.4, {garbage}, 10.0.0.5")]),
                None,
                "{garbage}"
            );
        }
        // A spoofed trusted address left of the client changes nothing.
        assert_eq!(
            key(&e, peer, &["10.9.9.9, 203.0.113.9"]).as_deref(),
            Some("203.0.113.9")
        );
    }

    #[test]
    fn ipv6_clients_share_their_prefix() {
        let e = ByClientIp::new();
        let a = key(&e, Some("[2001:db8:1:2:aaaa::1]:1"), &[]);
        let b = key(&e, Some("[2001:db8:1:2:bbbb::2]:1"), &[]);
        assert_eq!(a, b);
        assert_eq!(a.as_deref(), Some("2001:db8:1:2::"));
        let e = e.ipv6_prefix(128);
        assert_ne!(
            key(&e, Some("[2001:db8::1]:1"), &[]),
            key(&e, Some("[2001:db8::2]:1"), &[])
        );
        // IPv4-mapped peers are IPv4 clients.
        assert_eq!(
            key(&ByClientIp::new(), Some("[::ffff:198.51.100.3]:1"), &[]).as_deref(),
            Some("198.51.100.3")
        );
    }

    #[test]
    fn other_extractors() {
        let req = http::Request::post("/flash-sale/SKU-1?x=1")
            .header("x-user-id", "u1")
            .body(())
            .unwrap();
        let p = req.into_parts().0;
        assert_eq!(ByUser::default().extract_key(&p).as_deref(), Some("u1"));
        assert_eq!(
            ByRoute.extract_key(&p).as_deref(),
            Some("POST /flash-sale/SKU-1")
        );
        assert_eq!(Global.extract_key(&p).as_deref(), Some(""));
        assert!(matches!(ByUser::default().missing(), MissingKey::Caller(_)));
    }
}
