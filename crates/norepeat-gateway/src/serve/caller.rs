//! Who the caller is: `identity.header` (hashed) or the peer address
//! (`X-Forwarded-For` believed only from `trusted_proxies`), read by the
//! library's [`ByClientIp`], the one implementation of that walk.

use crate::config::{Identity, IdentitySource};
use axum::extract::ConnectInfo;
use http::request::Parts;
use http::{Extensions, HeaderName};
use norepeat::identity::Identify;
use norepeat::ratelimit::{ByClientIp, ExtractKey, MissingKey, PeerAddr};
use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;

/// The caller as the file's `identity` names it, for every guard. A
/// header's value is hashed (BLAKE3) before any layer sees it, so a bearer
/// token is never stored or logged as it is.
///
/// ```
/// use norepeat::identity::Identify;
/// use norepeat_gateway::config::Config;
/// use norepeat_gateway::serve::Caller;
///
/// let config = Config::parse("g.yaml", b"
/// upstream: http://127.0.0.1:9000
/// identity: { header: Authorization, required: true }
/// ")?;
/// let caller = Caller::new(&config.identity);
/// let req = http::Request::get("/").header("authorization", "Bearer s3cret").body(()).unwrap();
/// let id = caller.identify(&req.into_parts().0).unwrap();
/// assert!(id.starts_with("h:") && !id.contains("s3cret"));
/// let anonymous = http::Request::get("/").body(()).unwrap();
/// assert_eq!(caller.identify(&anonymous.into_parts().0), None);
/// # Ok::<(), norepeat_gateway::config::Problems>(())
/// ```
#[derive(Debug, Clone)]
pub struct Caller {
    header: Option<HeaderName>,
    ip: Arc<ByClientIp>,
    required: bool,
}

impl Caller {
    /// The caller of `identity`.
    #[must_use]
    pub fn new(identity: &Identity) -> Self {
        let header = match &identity.source {
            IdentitySource::PeerAddress => None,
            IdentitySource::Header(h) => HeaderName::from_bytes(h.as_bytes()).ok(),
        };
        let ip = identity
            .trusted_proxies
            .iter()
            .fold(ByClientIp::new(), |ip, net| {
                ip.trust_net(net.network(), net.prefix_len())
            });
        Self {
            header,
            ip: Arc::new(ip),
            required: identity.required,
        }
    }

    /// Whether the connection's peer is a trusted proxy, whose forwarding
    /// headers (`X-Forwarded-*`, `Forwarded`) are passed on; an unknown
    /// peer (a request made in process) is not.
    pub(crate) fn peer_is_trusted(&self, extensions: &Extensions) -> bool {
        extensions
            .get::<PeerAddr>()
            .is_some_and(|PeerAddr(a)| self.ip.is_trusted(a.ip()))
    }

    /// The client's address, for `rate_limit.by: address`: the library's
    /// [`ByClientIp`] key (an IPv6 client counted by its /64).
    #[must_use]
    pub(crate) fn address(&self) -> ByAddress {
        ByAddress(Arc::clone(&self.ip))
    }
}

/// Puts the connection's peer in `extensions` as the library's
/// [`PeerAddr`], which [`ByClientIp`] reads (axum's server puts it there as
/// `ConnectInfo`).
pub(crate) fn with_peer(extensions: &mut Extensions) {
    if let Some(&ConnectInfo(addr)) = extensions.get::<ConnectInfo<SocketAddr>>() {
        extensions.insert(PeerAddr(addr));
    }
}

impl Identify for Caller {
    fn identify(&self, parts: &Parts) -> Option<String> {
        if let Some(name) = &self.header {
            let mut values = parts.headers.get_all(name).iter();
            match (values.next(), values.next()) {
                (Some(v), None) if !v.is_empty() && v.len() <= 8192 => {
                    let value = if is_credentials(name) {
                        credentials(v.as_bytes())
                    } else {
                        Cow::Borrowed(v.as_bytes())
                    };
                    let hash = blake3::keyed_hash(KEY, &value);
                    return Some(format!("h:{}", &hash.to_hex()[..32]));
                }
                _ if self.required => return None,
                _ => {}
            }
        }
        self.ip.client_ip(parts).map(|ip| format!("ip:{ip}"))
    }

    fn missing(&self) -> Cow<'static, str> {
        match &self.header {
            Some(h) => Cow::Owned(format!("Exactly one {h} header is required.")),
            None => Cow::Borrowed("The peer address is unknown."),
        }
    }
}

/// Whether `name` carries `scheme credentials` (RFC 9110 §11.6.2, §11.7.2).
fn is_credentials(name: &HeaderName) -> bool {
    name == http::header::AUTHORIZATION || name == http::header::PROXY_AUTHORIZATION
}

/// `scheme credentials` in one spelling per caller: the scheme is
/// case-insensitive (RFC 9110 §11.1) and the whitespace between the parts
/// is not the caller's, so `bearer T`, `BEARER T` and `Bearer  T` are
/// `Bearer T`, the spelling clients send (and so the one whose hash the
/// release before this one gave, keeping its records theirs). The
/// credentials themselves are kept as they are (a token is case-sensitive).
fn credentials(v: &[u8]) -> Cow<'_, [u8]> {
    let mut parts = v.split(u8::is_ascii_whitespace).filter(|p| !p.is_empty());
    let Some(scheme) = parts.next() else {
        return Cow::Borrowed(v);
    };
    let mut out = Vec::with_capacity(v.len());
    for (i, b) in scheme.iter().enumerate() {
        out.push(if i == 0 {
            b.to_ascii_uppercase()
        } else {
            b.to_ascii_lowercase()
        });
    }
    for p in parts {
        out.push(b' ');
        out.extend_from_slice(p);
    }
    if out == v {
        Cow::Borrowed(v)
    } else {
        Cow::Owned(out)
    }
}

/// The domain of the identity hash (a fixed key: the hash names a caller,
/// it is not a secret).
const KEY: &[u8; 32] = b"norepeat-gateway identity v1 ...";

/// The client's address, for `rate_limit.by: address`.
#[derive(Debug, Clone)]
pub(crate) struct ByAddress(Arc<ByClientIp>);

impl ExtractKey for ByAddress {
    fn extract_key(&self, parts: &Parts) -> Option<String> {
        self.0.extract_key(parts)
    }
}

impl ExtractKey for Caller {
    fn extract_key(&self, parts: &Parts) -> Option<String> {
        self.identify(parts)
    }

    /// No caller on a rate-limited route is 401 `unauthenticated`, as on a
    /// guarded one.
    fn missing(&self) -> MissingKey {
        MissingKey::Caller(Identify::missing(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(peer: &str, xff: &[&str], user: Option<&str>) -> Parts {
        let mut req = http::Request::get("/");
        for v in xff {
            req = req.header("x-forwarded-for", *v);
        }
        if let Some(u) = user {
            req = req.header("x-user-id", u);
        }
        let mut req = req.body(()).unwrap();
        let peer: SocketAddr = match peer.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V6(v6)) => format!("[{v6}]:4000"),
            _ => format!("{peer}:4000"),
        }
        .parse()
        .unwrap();
        req.extensions_mut().insert(ConnectInfo(peer));
        with_peer(req.extensions_mut());
        req.into_parts().0
    }

    /// One caller per bearer token, however the scheme is spelled or the
    /// parts spaced (before: `Bearer T`, `bearer T`, `BEARER T` and
    /// `Bearer  T` were four callers, and one token had four rate limits);
    /// the token itself stays case-sensitive, and the usual spelling hashes
    /// as it did before (the same records and limits across a deploy).
    #[test]
    fn an_authorization_identity_is_its_scheme_and_credentials() {
        let config = crate::config::Config::parse(
            "g.yaml",
            b"upstream: http://127.0.0.1:9\nidentity: { header: Authorization }\n",
        )
        .unwrap();
        let caller = Caller::new(&config.identity);
        let id = |v: &str| {
            let req = http::Request::get("/")
                .header("authorization", v)
                .body(())
                .unwrap();
            caller.identify(&req.into_parts().0).unwrap()
        };
        let usual = id("Bearer T0ken");
        for v in [
            "bearer T0ken",
            "BEARER T0ken",
            "Bearer  T0ken",
            "Bearer\tT0ken",
        ] {
            assert_eq!(id(v), usual, "{v}");
        }
        assert_ne!(id("Bearer t0ken"), usual, "credentials are case-sensitive");
        let before = blake3::keyed_hash(KEY, b"Bearer T0ken");
        assert_eq!(usual, format!("h:{}", &before.to_hex()[..32]));
        assert_eq!(&*credentials(b"Basic  dXNlcg=="), b"Basic dXNlcg==");
    }

    fn trusting(list: &[&str]) -> Caller {
        Caller::new(&Identity {
            trusted_proxies: list.iter().map(|n| n.parse().unwrap()).collect(),
            ..Identity::default()
        })
    }

    #[test]
    fn x_forwarded_for_is_believed_only_from_a_trusted_proxy() {
        let caller = trusting(&["10.0.0.0/8"]);
        let ip = |p: &Parts| {
            caller
                .identify(p)
                .map(|a| a.trim_start_matches("ip:").to_owned())
        };
        // An untrusted peer: its own address, whatever it claims.
        assert_eq!(
            ip(&parts("203.0.113.5", &["1.2.3.4"], None)).as_deref(),
            Some("203.0.113.5")
        );
        // A trusted proxy: the rightmost address that is not a proxy.
        assert_eq!(
            ip(&parts("10.0.0.1", &["6.6.6.6, 1.2.3.4, 10.0.0.2"], None)).as_deref(),
            Some("1.2.3.4")
        );
        // Two header lines read as one list, last line last.
        assert_eq!(
            ip(&parts("10.0.0.1", &["1.2.3.4", "10.0.0.9"], None)).as_deref(),
            Some("1.2.3.4")
        );
        // A trusted proxy that forwards nothing: the proxy itself.
        assert_eq!(
            ip(&parts("10.0.0.1", &[], None)).as_deref(),
            Some("10.0.0.1")
        );
        // An entry that is not an address where the client should be: no
        // caller (before: the proxy itself, one scope for all such clients).
        assert_eq!(ip(&parts("10.0.0.1", &["1.2.3.4, junk"], None)), None);
    }

    /// A dual-stack listener sees an IPv4 proxy as `::ffff:10.0.0.1`: it is
    /// still the trusted `10.0.0.0/8`, and the client behind it is read
    /// from `X-Forwarded-For`, by the identity and by `by: address` alike.
    #[test]
    fn an_ipv4_mapped_proxy_is_trusted_as_its_ipv4_address() {
        let caller = trusting(&["10.0.0.0/8"]);
        let p = parts("::ffff:10.0.0.1", &["203.0.113.7"], None);
        assert_eq!(caller.identify(&p).as_deref(), Some("ip:203.0.113.7"));
        assert_eq!(
            caller.address().extract_key(&p).as_deref(),
            Some("203.0.113.7")
        );
        // An untrusted mapped peer is its IPv4 address, whatever it claims.
        let p = parts("::ffff:192.0.2.9", &["203.0.113.7"], None);
        assert_eq!(caller.identify(&p).as_deref(), Some("ip:192.0.2.9"));
    }

    #[test]
    fn a_header_identity_is_hashed_and_falls_back_to_the_address_unless_required() {
        let mut identity = Identity {
            source: IdentitySource::Header("x-user-id".into()),
            ..Identity::default()
        };
        let caller = Caller::new(&identity);
        let u1 = caller
            .identify(&parts("192.0.2.1", &[], Some("u1")))
            .unwrap();
        assert!(u1.starts_with("h:") && !u1.contains("u1"));
        assert_eq!(
            caller
                .identify(&parts("192.0.2.7", &[], Some("u1")))
                .unwrap(),
            u1,
            "the same caller from anywhere"
        );
        assert_eq!(
            caller.identify(&parts("192.0.2.1", &[], None)).as_deref(),
            Some("ip:192.0.2.1")
        );
        identity.required = true;
        let required = Caller::new(&identity);
        assert_eq!(required.identify(&parts("192.0.2.1", &[], None)), None);
        assert!(matches!(
            ExtractKey::missing(&required),
            MissingKey::Caller(_)
        ));
    }
}
