//! Who the caller is: `identity.header` (hashed) or the peer address
//! (`X-Forwarded-For` believed only from `trusted_proxies`).

use crate::config::{Identity, IdentitySource, IpNet};
use axum::extract::ConnectInfo;
use http::HeaderName;
use http::request::Parts;
use norepeat::identity::Identify;
use norepeat::ratelimit::{ExtractKey, MissingKey};
use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
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
    trusted: Arc<[IpNet]>,
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
        Self {
            header,
            trusted: identity.trusted_proxies.clone().into(),
            required: identity.required,
        }
    }

    /// The client's address (see [`client_ip`]).
    #[must_use]
    pub(crate) fn address(&self) -> ByAddress {
        ByAddress(Arc::clone(&self.trusted))
    }
}

impl Identify for Caller {
    fn identify(&self, parts: &Parts) -> Option<String> {
        if let Some(name) = &self.header {
            let mut values = parts.headers.get_all(name).iter();
            match (values.next(), values.next()) {
                (Some(v), None) if !v.is_empty() && v.len() <= 8192 => {
                    let hash = blake3::keyed_hash(KEY, v.as_bytes());
                    return Some(format!("h:{}", &hash.to_hex()[..32]));
                }
                _ if self.required => return None,
                _ => {}
            }
        }
        client_ip(parts, &self.trusted).map(|ip| format!("ip:{ip}"))
    }

    fn missing(&self) -> Cow<'static, str> {
        match &self.header {
            Some(h) => Cow::Owned(format!("Exactly one {h} header is required.")),
            None => Cow::Borrowed("The peer address is unknown."),
        }
    }
}

/// The domain of the identity hash (a fixed key: the hash names a caller,
/// it is not a secret).
const KEY: &[u8; 32] = b"norepeat-gateway identity v1 ...";

/// The client's address, for `rate_limit.by: address`.
#[derive(Debug, Clone)]
pub(crate) struct ByAddress(Arc<[IpNet]>);

impl ExtractKey for ByAddress {
    fn extract_key(&self, parts: &Parts) -> Option<String> {
        client_ip(parts, &self.0).map(|ip| ip.to_string())
    }
}

/// The peer address, or, when the peer is a trusted proxy, the rightmost
/// address of `X-Forwarded-For` that is not one.
#[must_use]
pub(crate) fn client_ip(parts: &Parts, trusted: &[IpNet]) -> Option<IpAddr> {
    let peer = parts.extensions.get::<ConnectInfo<SocketAddr>>()?.0.ip();
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|n| n.contains(ip));
    if !is_trusted(&peer) {
        return Some(peer);
    }
    let mut ip = peer;
    let values: Vec<_> = parts.headers.get_all("x-forwarded-for").iter().collect();
    for v in values.into_iter().rev() {
        let Ok(s) = v.to_str() else { return Some(ip) };
        for part in s.rsplit(',') {
            let Ok(a) = part.trim().parse::<IpAddr>() else {
                return Some(ip);
            };
            ip = a;
            if !is_trusted(&a) {
                return Some(a);
            }
        }
    }
    Some(ip)
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
        let peer: SocketAddr = format!("{peer}:4000").parse().unwrap();
        req.extensions_mut().insert(ConnectInfo(peer));
        req.into_parts().0
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn x_forwarded_for_is_believed_only_from_a_trusted_proxy() {
        let trusted = nets(&["10.0.0.0/8"]);
        let ip = |p: &Parts| client_ip(p, &trusted).map(|a| a.to_string());
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
        // Garbage stops the walk at the last address believed.
        assert_eq!(
            ip(&parts("10.0.0.1", &["1.2.3.4, junk"], None)).as_deref(),
            Some("10.0.0.1")
        );
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
