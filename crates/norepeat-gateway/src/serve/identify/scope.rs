//! Whose keys: the caller on the site it called. One gateway often fronts
//! several sites (`a.shop.example`, `b.shop.example`) whose users are
//! numbered apart, so user `42` with key `checkout-7` on one site is not
//! user `42` with that key on the other: the idempotency and fingerprint
//! guards scope their keys by the caller *and* the `Host` (as Kong's
//! idempotency plugin does). Rate limits and tokens keep the caller alone:
//! a limit is the caller's budget wherever it spends it, and a token is
//! the caller's, signed for it.

use crate::config::host_span;
use crate::config::normalize_host;
use crate::serve::identify::caller::Caller;
use http::request::Parts;
use http::{HeaderMap, Uri};
use norepeat::identity::Identify;
use std::borrow::Cow;
use std::sync::Arc;

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
///
/// A file with `hosts` names one site by several names: its keys are that
/// site's, whichever name a request used ([`HostScoped::site`]).
#[derive(Debug, Clone)]
pub struct HostScoped {
    caller: Caller,
    /// The one site every request is scoped to (the first of `hosts`).
    site: Option<Arc<str>>,
}

impl HostScoped {
    /// Scopes `caller` by the request's site.
    #[must_use]
    pub fn new(caller: Caller) -> Self {
        Self { caller, site: None }
    }

    /// Scopes every request to `site` (in [`normalize_host`]'s spelling),
    /// whatever its `Host`: for a file whose `hosts` lists the site's
    /// names, every other Host being refused before a key is read.
    /// `None`: the request's own site.
    ///
    /// ```
    /// use norepeat::identity::Identify;
    /// use norepeat_gateway::config::Config;
    /// use norepeat_gateway::serve::{Caller, HostScoped};
    ///
    /// let config = Config::parse("g.yaml", b"upstream: http://127.0.0.1:9000\nidentity: { header: X-User-Id }\n")?;
    /// let scoped = HostScoped::new(Caller::new(&config.identity)).site(Some("shop.example".into()));
    /// let on = |host: &str| {
    ///     let req = http::Request::post("/payments").header("x-user-id", "42").header("host", host);
    ///     scoped.identify(&req.body(()).unwrap().into_parts().0).unwrap()
    /// };
    /// assert_eq!(on("shop.example"), on("www.shop.example"));
    /// # Ok::<(), norepeat_gateway::config::Problems>(())
    /// ```
    #[must_use]
    pub fn site(mut self, site: Option<Arc<str>>) -> Self {
        self.site = site;
        self
    }

    /// The caller it scopes.
    #[must_use]
    pub fn caller(&self) -> &Caller {
        &self.caller
    }
}

impl Identify for HostScoped {
    fn identify(&self, parts: &Parts) -> Option<String> {
        let caller = self.caller.identify(parts)?;
        let hash = match &self.site {
            Some(site) => blake3::keyed_hash(SITE_KEY, site.as_bytes()),
            None => match site_hash(&parts.headers, &parts.uri) {
                Some(hash) => hash,
                None => return Some(caller),
            },
        };
        // The first 8 bytes of the hash, in hex.
        let mut hex = [0u8; 16];
        hex::encode_to_slice(&hash.as_bytes()[..8], &mut hex).expect("16 digits for 8 bytes");
        let mut id = caller;
        id.reserve_exact(1 + hex.len());
        id.push('@');
        id.push_str(std::str::from_utf8(&hex).expect("hex digits"));
        Some(id)
    }

    fn missing(&self) -> Cow<'static, str> {
        self.caller.missing()
    }
}

/// The domain of the site hash.
const SITE_KEY: &[u8; 32] = b"norepeat-gateway site scope v1..";

/// The request's site in one spelling ([`normalize_host`]), or `None`
/// when it names none.
///
/// The URI's authority first (HTTP/2's `:authority`, an absolute-form
/// target), then `Host`: the order `upstream` sends the backend its `Host`
/// in, so the site the guards key and match by is the site the backend
/// serves. (A request whose two disagree is refused before this:
/// `request::not_forwarded`.)
pub(crate) fn site(headers: &HeaderMap, uri: &Uri) -> Option<String> {
    normalize_host(raw_site(headers, uri)?)
}

/// The site as the request names it, before [`normalize_host`].
fn raw_site<'a>(headers: &'a HeaderMap, uri: &'a Uri) -> Option<&'a str> {
    match uri.authority() {
        Some(a) => Some(a.as_str()),
        None => headers.get(http::header::HOST)?.to_str().ok(),
    }
}

/// The keyed hash of the request's [`site`], which keys take: hashed, as a
/// `Host` is the client's to choose (up to the header limit) and a key's
/// length is not. A site of up to [`SHORT_HOST`] bytes (every real one) is
/// lower-cased on the stack.
fn site_hash(headers: &HeaderMap, uri: &Uri) -> Option<blake3::Hash> {
    let span = host_span(raw_site(headers, uri)?)?;
    let mut buf = [0u8; SHORT_HOST];
    Some(match buf.get_mut(..span.len()) {
        Some(site) => {
            site.copy_from_slice(span.as_bytes());
            site.make_ascii_lowercase();
            // Most requests of a thread name the site the one before it
            // named: its hash is kept, one per thread.
            LAST_SITE.with(|last| {
                let mut last = last.borrow_mut();
                match &*last {
                    Some((seen, hash)) if seen.as_slice() == &*site => *hash,
                    _ => {
                        let hash = blake3::keyed_hash(SITE_KEY, site);
                        // The kept bytes' room is used again.
                        let mut seen = last.take().map(|(v, _)| v).unwrap_or_default();
                        seen.clear();
                        seen.extend_from_slice(site);
                        *last = Some((seen, hash));
                        hash
                    }
                }
            })
        }
        None => blake3::keyed_hash(SITE_KEY, span.to_ascii_lowercase().as_bytes()),
    })
}

thread_local! {
    /// The last site [`site_hash`] hashed on this thread, and its hash.
    static LAST_SITE: std::cell::RefCell<Option<(Vec<u8>, blake3::Hash)>> =
        const { std::cell::RefCell::new(None) };
}

/// The longest site [`site_hash`] lower-cases on the stack.
const SHORT_HOST: usize = 256;

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

    /// The hash kept for the last site is never another site's.
    #[test]
    fn a_sites_hash_is_its_own_whichever_came_before() {
        let hash = |host: &str| {
            let req = http::Request::get("/")
                .header("host", host)
                .body(())
                .unwrap();
            site_hash(req.headers(), req.uri()).unwrap()
        };
        let a = hash("a.example");
        let b = hash("b.example");
        assert_ne!(a, b);
        assert_eq!(hash("A.Example"), a);
        assert_eq!(hash("b.example:443"), b);
        assert_eq!(a, blake3::keyed_hash(SITE_KEY, b"a.example"));
        assert_eq!(hash("a.example"), a);
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

    /// The id a site-scoped caller gets for `host` (the caller `42` by
    /// header), and the one the release before gave: the caller, `@`, the
    /// first 16 hex digits of the keyed hash of `normalize_host`'s
    /// spelling; the caller alone for a request that names no site.
    fn ids(host: &str) -> (String, String) {
        let config = crate::config::Config::parse(
            "g.yaml",
            b"upstream: http://127.0.0.1:9000\nidentity: { header: X-User-Id }\n",
        )
        .unwrap();
        let caller = Caller::new(&config.identity);
        let req = |host: Option<&str>| {
            let mut req = http::Request::post("/pay").header("x-user-id", "42");
            if let Some(h) = host {
                req = req.header("host", h);
            }
            req.body(()).unwrap().into_parts().0
        };
        let got = HostScoped::new(caller.clone())
            .identify(&req(Some(host)))
            .unwrap();
        let alone = caller.identify(&req(None)).unwrap();
        let want = match normalize_host(host) {
            Some(site) => {
                let old = blake3::keyed_hash(SITE_KEY, site.as_bytes()).to_hex();
                format!("{alone}@{}", &old[..16])
            }
            None => alone,
        };
        (got, want)
    }

    /// Every key of every record written since site scoping began is made
    /// of this id: it must not move.
    #[test]
    fn a_scoped_id_is_the_one_already_stored() {
        let long = format!("{}.Example", "a".repeat(300));
        for host in [
            "Shop.Example.:8443",
            " shop.example ",
            "[::1]:80",
            ":80",
            long.as_str(),
        ] {
            let (got, want) = ids(host);
            assert_eq!(got, want, "{host}");
        }
    }

    proptest::proptest! {
        #[test]
        fn a_scoped_id_is_the_one_already_stored_for_any_host(
            host in "[ \tA-Za-z0-9.:\\[\\]-]{0,24}|[A-Za-z.]{250,262}",
        ) {
            let (got, want) = ids(&host);
            proptest::prop_assert_eq!(got, want);
        }
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
