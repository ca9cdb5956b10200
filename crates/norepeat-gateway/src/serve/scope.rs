//! Whose keys: the caller on the site it called. One gateway often fronts
//! several sites (`a.shop.example`, `b.shop.example`) whose users are
//! numbered apart, so user `42` with key `checkout-7` on one site is not
//! user `42` with that key on the other: the idempotency and fingerprint
//! guards scope their keys by the caller *and* the `Host` (as Kong's
//! idempotency plugin does). Rate limits and tokens keep the caller alone:
//! a limit is the caller's budget wherever it spends it, and a token is
//! the caller's, signed for it.

use super::caller::Caller;
use crate::config::normalize_host;
use http::request::Parts;
use http::{HeaderMap, Uri};
use norepeat::identity::Identify;
use std::borrow::Cow;

/// The caller's identity joined with the request's site, for the guards
/// whose keys name an effect (idempotency, fingerprint).
///
/// The site is the `Host` header (or, for HTTP/2 and absolute-form
/// requests, the URI's authority) in one spelling ([`normalize_host`]):
/// `Shop.Example`, `shop.example.` and `shop.example:8443` are one site.
/// A request without any is scoped by the caller alone.
///
/// ```
/// use norepeat::identity::Identify;
/// use norepeat_gateway::config::Config;
/// use norepeat_gateway::serve::{Caller, HostScoped};
///
/// let config = Config::parse("g.yaml", b"
/// upstream: http://127.0.0.1:9000
/// identity: { header: X-User-Id }
/// ")?;
/// let scoped = HostScoped::new(Caller::new(&config.identity));
/// let on = |host: &str| {
///     let req = http::Request::post("/payments")
///         .header("x-user-id", "42")
///         .header("host", host)
///         .body(())
///         .unwrap();
///     scoped.identify(&req.into_parts().0).unwrap()
/// };
/// assert_ne!(on("a.shop.example"), on("b.shop.example"));
/// assert_eq!(on("a.shop.example"), on("A.Shop.Example."));
/// # Ok::<(), norepeat_gateway::config::Problems>(())
/// ```
#[derive(Debug, Clone)]
pub struct HostScoped {
    caller: Caller,
}

impl HostScoped {
    /// Scopes `caller` by the request's site.
    #[must_use]
    pub fn new(caller: Caller) -> Self {
        Self { caller }
    }
}

impl Identify for HostScoped {
    fn identify(&self, parts: &Parts) -> Option<String> {
        let caller = self.caller.identify(parts)?;
        let Some(site) = site(&parts.headers, &parts.uri) else {
            return Some(caller);
        };
        // Hashed: a Host is the client's to choose (up to the header
        // limit), a key's length is not.
        let hash = blake3::keyed_hash(SITE_KEY, site.as_bytes());
        let mut id = caller;
        id.push('@');
        id.push_str(&hash.to_hex()[..16]);
        Some(id)
    }

    fn missing(&self) -> Cow<'static, str> {
        self.caller.missing()
    }
}

/// The caller alone, as releases before site scoping keyed it, until
/// `until` (Unix ms): the layer's
/// [`previous_identity`](norepeat::idempotency::IdempotencyLayer::previous_identity)
/// while a retry of a request first made before the upgrade may come.
#[derive(Debug, Clone)]
pub(crate) struct Unscoped {
    caller: Caller,
    until: u64,
}

impl Unscoped {
    pub(crate) fn until(caller: Caller, until: u64) -> Self {
        Self { caller, until }
    }
}

impl Identify for Unscoped {
    fn identify(&self, parts: &Parts) -> Option<String> {
        if now_ms() >= self.until {
            return None;
        }
        self.caller.identify(parts)
    }
}

/// The wall clock in Unix milliseconds (the library's).
pub(crate) fn now_ms() -> u64 {
    norepeat::clock::Clock::now_ms(&norepeat::clock::SystemClock)
}

/// The domain of the site hash.
const SITE_KEY: &[u8; 32] = b"norepeat-gateway site scope v1..";

/// The request's site in one spelling ([`normalize_host`]), or `None`
/// when it names none.
///
/// The URI's authority first (HTTP/2's `:authority`, an absolute-form
/// target), then `Host`: the order `forward` sends the backend its `Host`
/// in, so the site the guards key and match by is the site the backend
/// serves. (A request whose two disagree is refused before this:
/// `request::not_forwarded`.)
pub(crate) fn site(headers: &HeaderMap, uri: &Uri) -> Option<String> {
    let raw = match uri.authority() {
        Some(a) => a.as_str(),
        None => headers.get(http::header::HOST)?.to_str().ok()?,
    };
    normalize_host(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site_of(host: &str) -> Option<String> {
        let req = http::Request::get("/")
            .header("host", host)
            .body(())
            .unwrap();
        site(req.headers(), req.uri())
    }

    #[test]
    fn a_site_has_one_spelling() {
        for spelling in [
            "shop.example",
            "Shop.Example",
            "shop.example.",
            "shop.example:80",
            "SHOP.EXAMPLE.:443",
            " shop.example ",
        ] {
            assert_eq!(
                site_of(spelling).as_deref(),
                Some("shop.example"),
                "{spelling}"
            );
        }
        assert_eq!(
            site_of("shop.example:8080").as_deref(),
            Some("shop.example")
        );
        assert_eq!(site_of("[::1]:8080").as_deref(), Some("[::1]"));
        assert_eq!(site_of("[::1]").as_deref(), Some("[::1]"));
        assert_eq!(site_of(""), None);
    }

    #[test]
    fn an_h2_request_names_its_site_in_the_uri() {
        let req = http::Request::get("https://Shop.Example/pay")
            .body(())
            .unwrap();
        assert_eq!(
            site(req.headers(), req.uri()).as_deref(),
            Some("shop.example")
        );
    }
}
