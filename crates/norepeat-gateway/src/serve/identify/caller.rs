// Over 400 lines on purpose: every identity source and how its value is read (a header's credentials, a cookie as frameworks decode it, a JWT), each beside the tests of its spellings.
//! Who the caller is: the file's `identity` (or a route's own): a header,
//! one named cookie, a verified bearer JWT's claim or the user the backend
//! names (`introspect`, asked in the identify phase: `introspect.rs`), each
//! hashed with its kind, the first of several present (`any_of`), or the peer address
//! (`X-Forwarded-For` believed only from `trusted_proxies`), read by the
//! library's [`ByClientIp`], the one implementation of that walk.

use crate::config::{Identity, IdentitySource, JwtKeys, Upstream};
use crate::jwt::{KeySet, Refused, Rules};
use crate::serve::files::stat;
use crate::serve::identify::hash::hashed;
use crate::serve::identify::introspect::{Introspected, Introspector};
use arc_swap::ArcSwapOption;
use axum::extract::ConnectInfo;
use http::request::Parts;
use http::{Extensions, HeaderMap, HeaderName};
use norepeat::identity::Identify;
use norepeat::ratelimit::{ByClientIp, ExtractKey, MissingKey, PeerAddr};
use std::borrow::Cow;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// The caller as the file's `identity` names it, for every guard. A
/// header's or a cookie's value, or a JWT's claim, is hashed (BLAKE3)
/// before any layer sees it, so a bearer token or a session id is never
/// stored or logged as it is. Each kind hashes into its own space (`h:`,
/// `c:`, `j:`, and `ip:` for the address), so a cookie's value and a
/// header's never name one caller.
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
///
/// // One named cookie: another cookie beside it does not change the caller.
/// let config = Config::parse("g.yaml", b"
/// upstream: http://127.0.0.1:9000
/// identity: { cookie: sid }
/// ")?;
/// let caller = Caller::new(&config.identity);
/// let with = |cookies: &str| {
///     let req = http::Request::get("/").header("cookie", cookies).body(()).unwrap();
///     caller.identify(&req.into_parts().0).unwrap()
/// };
/// assert_eq!(with("sid=abc; _ga=GA1.1"), with("_ga=GA1.2; sid=abc"));
/// assert!(with("sid=abc").starts_with("c:"));
/// // One value however it is spelled: quoted, escaped, percent-encoded.
/// assert_eq!(with("sid=abc"), with(r#"sid="\141bc""#));
/// assert_eq!(with("sid=abc"), with("sid=%61bc"));
/// # Ok::<(), norepeat_gateway::config::Problems>(())
/// ```
#[derive(Debug, Clone)]
pub struct Caller {
    source: Arc<Source>,
    ip: Arc<ByClientIp>,
    required: bool,
    /// What the identify phase does on the route: ask the backend (for
    /// an `introspect` source), on a route that reads the caller.
    asks: Asks,
}

/// Whether, and how, the identify phase asks the backend on a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Asks {
    /// The route reads the caller: no answer from the backend is the
    /// client's 401 or 503.
    Refusing,
    /// A `shadow` route: no answer is no caller, which its layers count
    /// and let through.
    Observing,
    /// Nothing of the route reads the caller (it only routes, or limits
    /// by address), or no source of it asks the backend: never asked.
    Never,
}

/// A source of the caller, ready to read.
#[derive(Debug)]
enum Source {
    Peer,
    Header(HeaderName),
    Cookie(String),
    Jwt(Bearer),
    /// The user the backend named, asked in the identify phase; `None`
    /// for a caller made without its upstream ([`Caller::new`]), which
    /// cannot ask: its credentials name no one.
    Introspect(Option<Arc<Introspector>>),
    AnyOf(Vec<Source>),
}

/// What one source found in a request.
#[derive(Debug, PartialEq, Eq)]
enum Read {
    /// The caller.
    Found(String),
    /// Nothing of this source's: the next source (or the fallback).
    Absent,
    /// A credential that does not hold (a JWT that does not verify): no
    /// caller, whatever else the request carries.
    Invalid,
}

impl Caller {
    /// The caller of `identity`. An `introspect` source needs the route's
    /// upstream, which the gateway gives it when it builds its routes:
    /// here it asks no one, and a request with a `Cookie` or an
    /// `Authorization` has no caller (one with neither is as one without
    /// a source: the address, unless `required`).
    ///
    /// ```
    /// use norepeat::identity::Identify;
    /// use norepeat_gateway::config::Config;
    /// use norepeat_gateway::serve::Caller;
    ///
    /// let config = Config::parse("g.yaml", b"
    /// upstream: http://127.0.0.1:9000
    /// identity: { introspect: { path: /whoami, user: { header: X-User-Id } } }
    /// ")?;
    /// let caller = Caller::new(&config.identity);
    /// let req = http::Request::get("/").header("cookie", "session=abc").body(()).unwrap();
    /// assert_eq!(caller.identify(&req.into_parts().0), None);
    /// # Ok::<(), norepeat_gateway::config::Problems>(())
    /// ```
    #[must_use]
    pub fn new(identity: &Identity) -> Self {
        let ip = identity
            .trusted_proxies
            .iter()
            .fold(ByClientIp::new(), |ip, net| {
                ip.trust_net(net.network(), net.prefix_len())
            });
        Self {
            source: Arc::new(Source::new(&identity.source, None)),
            ip: Arc::new(ip),
            required: identity.required,
            asks: Asks::Refusing,
        }
    }

    /// This caller on `route`: asked about only where a guard, or a rate
    /// limit by identity, reads it, and a source asks the backend
    /// (`introspect`); without refusing on a `shadow` route.
    #[must_use]
    pub(crate) fn on_route(mut self, route: &crate::config::Route) -> Self {
        let reads = route.guard.is_some()
            || route
                .rate_limit
                .is_some_and(|rl| rl.by == crate::config::LimitBy::Identity);
        // A source the layers read themselves (a header, a cookie, a JWT)
        // is not read here too: the phase would hash it to learn only
        // that it is present (1.2k instructions a request, by callgrind).
        self.asks = match (reads && self.introspects(), route.shadow) {
            (false, _) => Asks::Never,
            (true, true) => Asks::Observing,
            (true, false) => Asks::Refusing,
        };
        self
    }

    /// What the identify phase does on this caller's route.
    pub(crate) fn asks(&self) -> Asks {
        self.asks
    }

    /// The caller of `identity` on a route whose upstream is `upstream`:
    /// the one an `introspect` source asks.
    #[must_use]
    pub(crate) fn asking(identity: &Identity, upstream: &Upstream) -> Self {
        Self {
            source: Arc::new(Source::new(&identity.source, Some(upstream))),
            ..Self::new(identity)
        }
    }

    /// Whether the backend is asked who the caller is (`introspect`).
    pub(crate) fn introspects(&self) -> bool {
        self.source.introspects()
    }

    /// The introspection to run for the request in `parts` before its
    /// layers read the caller: the `introspect` source, when reading the
    /// sources in order reaches it (an `any_of` whose earlier source the
    /// request carries never asks).
    pub(crate) fn to_ask(&self, parts: &Parts) -> Option<&Introspector> {
        let list = match &*self.source {
            Source::AnyOf(list) => list.as_slice(),
            one => std::slice::from_ref(one),
        };
        for s in list {
            match s {
                Source::Introspect(i) => return i.as_deref(),
                other if other.read(parts, &self.ip) != Read::Absent => return None,
                _ => {}
            }
        }
        None
    }

    /// Whether the connection's peer is a trusted proxy, whose forwarding
    /// headers (`X-Forwarded-*`, `Forwarded`) are passed on; an unknown
    /// peer (a request made in process) is not.
    pub(crate) fn peer_is_trusted(&self, extensions: &Extensions) -> bool {
        extensions
            .get::<PeerAddr>()
            .is_some_and(|PeerAddr(a)| self.ip.is_trusted(a.ip()))
    }

    /// Whether a peer at `ip` is one of `trusted_proxies`.
    pub(crate) fn is_trusted(&self, ip: std::net::IpAddr) -> bool {
        self.ip.is_trusted(ip)
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
        match self.source.read(parts, &self.ip) {
            Read::Found(id) => Some(id),
            Read::Invalid => None,
            Read::Absent if self.required => None,
            Read::Absent => self.ip.client_ip(parts).map(ip_id),
        }
    }

    fn missing(&self) -> Cow<'static, str> {
        Cow::Owned(self.source.missing())
    }
}

impl Source {
    fn new(source: &IdentitySource, upstream: Option<&Upstream>) -> Self {
        match source {
            IdentitySource::PeerAddress => Source::Peer,
            // Checked by the file's parser: a header name.
            IdentitySource::Header(h) => {
                HeaderName::from_bytes(h.as_bytes()).map_or(Source::Peer, Source::Header)
            }
            IdentitySource::Cookie(name) => Source::Cookie(name.clone()),
            IdentitySource::Jwt(jwt) => Source::Jwt(Bearer::new(jwt)),
            IdentitySource::Introspect(i) => {
                Source::Introspect(upstream.map(|u| Arc::new(Introspector::new(i, u))))
            }
            IdentitySource::AnyOf(list) => {
                Source::AnyOf(list.iter().map(|s| Source::new(s, upstream)).collect())
            }
        }
    }

    fn introspects(&self) -> bool {
        match self {
            Source::Introspect(_) => true,
            Source::AnyOf(list) => list.iter().any(Source::introspects),
            _ => false,
        }
    }

    fn read(&self, parts: &Parts, ip: &ByClientIp) -> Read {
        match self {
            Source::Peer => ip
                .client_ip(parts)
                .map_or(Read::Absent, |ip| Read::Found(ip_id(ip))),
            Source::Header(name) => {
                let mut values = parts.headers.get_all(name).iter();
                match (values.next(), values.next()) {
                    (Some(v), None) if !v.is_empty() && v.len() <= 8192 => {
                        let value = if is_credentials(name) {
                            credentials(v.as_bytes())
                        } else {
                            Cow::Borrowed(v.as_bytes())
                        };
                        Read::Found(hashed("h", &[&value]))
                    }
                    _ => Read::Absent,
                }
            }
            Source::Cookie(name) => match cookie(&parts.headers, name) {
                Some(v) => Read::Found(hashed("c", &[&v])),
                None => Read::Absent,
            },
            Source::Jwt(bearer) => bearer.read(&parts.headers),
            Source::Introspect(_) => match parts.extensions.get::<Introspected>() {
                Some(Introspected(Some(id))) => Read::Found(id.to_string()),
                Some(Introspected(None)) => Read::Absent,
                // Not asked (a request that did not go through the identify
                // phase): a credential without a name is no caller.
                None if parts.headers.contains_key(http::header::COOKIE)
                    || parts.headers.contains_key(http::header::AUTHORIZATION) =>
                {
                    Read::Invalid
                }
                None => Read::Absent,
            },
            Source::AnyOf(list) => list
                .iter()
                .map(|s| s.read(parts, ip))
                .find(|r| *r != Read::Absent)
                .unwrap_or(Read::Absent),
        }
    }

    /// What a request without this source lacks (the 401's `detail`).
    fn missing(&self) -> String {
        match self {
            Source::Peer => "The peer address is unknown.".to_owned(),
            Source::Header(h) => format!("Exactly one {h} header is required."),
            Source::Cookie(name) => format!("The cookie {name} is required (once)."),
            Source::Jwt(b) => format!(
                "A bearer JWT (Authorization: Bearer ...) with a {} claim, whose signature verifies and that has not expired, is required.",
                b.claim
            ),
            Source::Introspect(_) => {
                "A Cookie or an Authorization header that the backend names a user for is required."
                    .to_owned()
            }
            Source::AnyOf(list) => {
                let each: Vec<String> = list.iter().map(Source::missing).collect();
                format!("One of these is required. {}", each.join(" Or: "))
            }
        }
    }
}

/// `ip:` and the address, as `format!("ip:{ip}")` spells it, without the
/// formatting machinery (this runs on every guarded request).
fn ip_id(ip: std::net::IpAddr) -> String {
    let mut buf = [0u8; 64];
    let text = crate::serve::upstream::headers::ip_text(ip, &mut buf);
    let mut id = String::with_capacity(3 + text.len());
    id.push_str("ip:");
    id.push_str(std::str::from_utf8(text).unwrap_or_default());
    id
}

/// The value of cookie `name` across every `Cookie` header (HTTP/2 sends
/// one a cookie; RFC 9113 §8.2.3 reads them as one list), decoded as the
/// backend's framework reads it ([`cookie_value`]). `None` when it is
/// absent, empty or over 4 KiB, its quote left open, or sent twice with
/// two values: the client does not choose which counts. A plain value (no
/// `\` in quotes, no `%`) is borrowed from the header, as it was before.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<Cow<'a, [u8]>> {
    let mut found: Option<Cow<'a, [u8]>> = None;
    for line in headers.get_all(http::header::COOKIE) {
        for pair in line.as_bytes().split(|&b| b == b';') {
            let Some((k, v)) = pair.split_once_byte(b'=') else {
                continue;
            };
            if k.trim_ascii() != name.as_bytes() {
                continue;
            }
            let v = cookie_value(v.trim_ascii())?;
            match &found {
                Some(f) if *f != v => return None,
                Some(_) => {}
                None => found = Some(v),
            }
        }
    }
    found.filter(|v| !v.is_empty() && v.len() <= 4096)
}

/// A cookie's value (trimmed) as the frameworks behind the gateway read
/// it, one reading for every spelling of one value, so that one session
/// is one caller however its cookie is written:
///
/// 1. In DQUOTEs (RFC 6265 §4.1.1), without them, and the backslash
///    escapes inside undone as Python's `http.cookies._unquote` and
///    werkzeug's `parse_cookie` undo them: `\NNN` (three octal digits,
///    the first 0 to 3) is that byte, `\X` is `X`, a last lone `\` stays.
///    Unquoted, a `\` is itself (to them and to Express).
/// 2. Then percent-decoded as `decodeURIComponent` decodes it for
///    Express's `cookie` package (Java and Go applications commonly
///    decode theirs so too): every `%XX` once, and `+` stays `+`; a value
///    it refuses (a `%` that starts no escape, or escapes that do not
///    spell UTF-8) is kept as sent, as `cookie` keeps it.
///
/// So `abc`, `"abc"`, `"\141bc"`, `"\a\b\c"` and `%61bc` are `abc`. A
/// value opened with `"` and not closed (`"abc1`) is `None`: Python reads
/// it as sent, Express's `cookie` (0.x) without its first and last bytes
/// (`abc`), Tomcat without the quote (`abc1`); no reading of it is the
/// caller's. The value stays bytes: nothing is replaced (werkzeug puts
/// U+FFFD for bytes that are not UTF-8), so two decoded values are never
/// one.
fn cookie_value(v: &[u8]) -> Option<Cow<'_, [u8]>> {
    let v: Cow<'_, [u8]> = match v {
        [b'"', inner @ .., b'"'] if inner.contains(&b'\\') => Cow::Owned(unescaped(inner)),
        [b'"', inner @ .., b'"'] => Cow::Borrowed(inner),
        [b'"', ..] => return None,
        _ => Cow::Borrowed(v),
    };
    Some(match percent_decoded(&v) {
        Some(decoded) => Cow::Owned(decoded),
        None => v,
    })
}

/// A quoted value's backslash escapes undone (`\NNN` octal, `\X`), left
/// to right, as Python's `http.cookies` and werkzeug do.
fn unescaped(mut rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(rest.len());
    loop {
        rest = match *rest {
            [
                b'\\',
                a @ b'0'..=b'3',
                b @ b'0'..=b'7',
                c @ b'0'..=b'7',
                ref tail @ ..,
            ] => {
                out.push(((a - b'0') << 6) | ((b - b'0') << 3) | (c - b'0'));
                tail
            }
            [b'\\', x, ref tail @ ..] | [x, ref tail @ ..] => {
                out.push(x);
                tail
            }
            [] => return out,
        };
    }
}

/// `v` percent-decoded as `decodeURIComponent` decodes it; `None` when it
/// holds no `%`, or when `decodeURIComponent` would refuse it (a `%` not
/// followed by two hex digits, or a run of escapes that is not UTF-8: a
/// character's bytes all escaped, none overlong or a surrogate).
fn percent_decoded(v: &[u8]) -> Option<Vec<u8>> {
    if !v.contains(&b'%') {
        return None;
    }
    let hex = |b: u8| match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    };
    let mut out = Vec::with_capacity(v.len());
    // Where the run of escaped bytes being decoded began in `out`.
    let mut run: Option<usize> = None;
    let mut i = 0;
    while i < v.len() {
        if v[i] == b'%' {
            let hi = hex(*v.get(i + 1)?)?;
            let lo = hex(*v.get(i + 2)?)?;
            run.get_or_insert(out.len());
            out.push((hi << 4) | lo);
            i += 3;
        } else {
            if let Some(start) = run.take() {
                std::str::from_utf8(&out[start..]).ok()?;
            }
            out.push(v[i]);
            i += 1;
        }
    }
    if let Some(start) = run {
        std::str::from_utf8(&out[start..]).ok()?;
    }
    Some(out)
}

/// `split_once` for bytes.
trait SplitOnce {
    fn split_once_byte(&self, at: u8) -> Option<(&[u8], &[u8])>;
}

impl SplitOnce for [u8] {
    fn split_once_byte(&self, at: u8) -> Option<(&[u8], &[u8])> {
        let i = self.iter().position(|&b| b == at)?;
        Some((&self[..i], &self[i + 1..]))
    }
}

/// `identity.jwt`: the claim of a bearer JWT that verifies.
struct Bearer {
    claim: String,
    rules: Rules,
    keys: Keys,
    /// The tokens verified, by their keyed hash: a client sends one token
    /// for many requests, and its signature is checked once (0.1 to 0.3
    /// ms of CPU for RS256 and ES256), not on every request and layer.
    verified: moka::sync::Cache<[u8; 32], Verified>,
}

impl std::fmt::Debug for Bearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bearer")
            .field("claim", &self.claim)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

/// A token that verified: the caller it names, until when (its `exp` and
/// the leeway), under which reading of the key file.
#[derive(Debug, Clone)]
struct Verified {
    id: Arc<str>,
    until: u64,
    generation: u64,
}

/// How many verified tokens are kept, and for how long at most (a token
/// living longer is verified again then).
const VERIFIED_TOKENS: u64 = 10_000;
const VERIFIED_FOR: Duration = Duration::from_secs(300);

/// The domain of a verified token's hash.
const TOKEN_KEY: &[u8; 32] = b"norepeat-gateway jwt verified v1";

#[derive(Debug)]
enum Keys {
    /// An HS256 secret (none when the secret is unusable: every token is
    /// refused).
    Fixed(Option<Arc<KeySet>>),
    /// A PEM or JWKS file, looked at again at most once every
    /// [`LOOK_EVERY`] (on a request) and read again when it changed.
    File(KeyFile),
}

impl Bearer {
    fn new(jwt: &crate::config::Jwt) -> Self {
        let keys = match &jwt.keys {
            JwtKeys::Secret { secret, .. } => Keys::Fixed(
                KeySet::secret(secret.as_bytes())
                    .inspect_err(|e| tracing::error!("identity.jwt: {e}"))
                    .ok()
                    .map(Arc::new),
            ),
            JwtKeys::PublicKeys(path) => Keys::File(KeyFile::new(path.clone())),
        };
        Self {
            claim: jwt.claim.clone(),
            rules: Rules {
                issuer: jwt.issuer.clone(),
                audiences: jwt.audiences.clone(),
            },
            keys,
            verified: moka::sync::Cache::builder()
                .max_capacity(VERIFIED_TOKENS)
                .time_to_live(VERIFIED_FOR)
                .build(),
        }
    }

    fn read(&self, headers: &HeaderMap) -> Read {
        let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
        let value = match (values.next(), values.next()) {
            (None, _) => return Read::Absent,
            (Some(v), None) => v.as_bytes(),
            // Two credentials: neither is taken.
            (Some(_), Some(_)) => return Read::Invalid,
        };
        let mut words = value
            .split(u8::is_ascii_whitespace)
            .filter(|w| !w.is_empty());
        match words.next() {
            Some(scheme) if scheme.eq_ignore_ascii_case(b"bearer") => {}
            // Another scheme (Basic): not this source's.
            _ => return Read::Absent,
        }
        let (Some(token), None) = (words.next(), words.next()) else {
            return Read::Invalid;
        };
        let Ok(token) = std::str::from_utf8(token) else {
            return Read::Invalid;
        };
        let (set, generation) = match &self.keys {
            Keys::Fixed(set) => (set.clone(), 0),
            Keys::File(file) => file.keys(),
        };
        let hash = *blake3::keyed_hash(TOKEN_KEY, token.as_bytes()).as_bytes();
        let now = jsonwebtoken::get_current_timestamp();
        if let Some(v) = self.verified.get(&hash)
            && v.generation == generation
            && now < v.until
        {
            return Read::Found(v.id.to_string());
        }
        let verified = match &set {
            Some(set) => set.verify(token, &self.rules),
            None => Err(Refused::Invalid),
        };
        let claims = match verified {
            Ok(c) => c,
            Err(why) => {
                tracing::debug!(?why, "a bearer JWT was refused");
                return Read::Invalid;
            }
        };
        let value = match claims.get(&self.claim) {
            Some(serde_json::Value::String(s)) if !s.is_empty() => s.clone(),
            Some(serde_json::Value::Number(n)) => n.to_string(),
            _ => return Read::Invalid,
        };
        // `sub` is unique within its issuer (OpenID Connect Core §2).
        let iss = claims
            .get("iss")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default();
        let id = hashed("j", &[iss.as_bytes(), value.as_bytes()]);
        // `exp` is required, so a token that verified has one.
        if let Some(exp) = claims.get("exp").and_then(serde_json::Value::as_u64) {
            let until = exp.saturating_add(crate::jwt::LEEWAY_SECS);
            let id = Arc::from(id.as_str());
            self.verified.insert(
                hash,
                Verified {
                    id,
                    until,
                    generation,
                },
            );
        }
        Read::Found(id)
    }
}

/// How often, at most, the key file is looked at (its modification time
/// and length): a rotated key is taken within about this long.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// A key file and the keys last read from it.
#[derive(Debug)]
struct KeyFile {
    path: PathBuf,
    keys: ArcSwapOption<KeySet>,
    /// How many times the file was read again: a token verified under an
    /// earlier reading is verified again (its key may be gone).
    generation: std::sync::atomic::AtomicU64,
    look: Mutex<Look>,
}

#[derive(Debug)]
struct Look {
    at: Instant,
    seen: Option<(Option<SystemTime>, u64)>,
}

impl KeyFile {
    fn new(path: PathBuf) -> Self {
        let seen = stat(&path);
        let keys = KeySet::read(&path)
            .inspect_err(|e| {
                tracing::error!(
                    "identity.jwt.public_keys: {e}; every token is refused until it is fixed"
                )
            })
            .ok()
            .map(Arc::new);
        Self {
            path,
            keys: ArcSwapOption::new(keys),
            generation: std::sync::atomic::AtomicU64::new(0),
            look: Mutex::new(Look {
                at: Instant::now(),
                seen,
            }),
        }
    }

    /// The keys, read again first if the file changed (looked at no more
    /// than once every [`LOOK_EVERY`]; a file that no longer reads keeps
    /// the keys it had).
    fn keys(&self) -> (Option<Arc<KeySet>>, u64) {
        if let Ok(mut look) = self.look.try_lock()
            && look.at.elapsed() >= LOOK_EVERY
        {
            look.at = Instant::now();
            let now = stat(&self.path);
            if now != look.seen {
                look.seen = now;
                match KeySet::read(&self.path) {
                    Ok(set) => {
                        tracing::info!(file = %self.path.display(), "identity.jwt.public_keys read again");
                        self.keys.store(Some(Arc::new(set)));
                        self.generation
                            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    Err(e) => {
                        tracing::error!("identity.jwt.public_keys: {e}; the keys read before stay")
                    }
                }
            }
        }
        // The generation first: keys stored after it was read are checked
        // under the older number, never the reverse.
        let generation = self.generation.load(std::sync::atomic::Ordering::SeqCst);
        (self.keys.load_full(), generation)
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

    /// An address's id, written without `format!`, is what `format!`
    /// wrote (records made before keep their keys).
    #[test]
    fn an_address_id_is_spelled_as_before() {
        for ip in [
            "0.0.0.0",
            "203.0.113.7",
            "255.255.255.255",
            "::1",
            "2001:db8::8a2e:370:7334",
            "::ffff:192.0.2.1",
            "fe80:1:2:3:4:5:6:7",
        ] {
            let ip: std::net::IpAddr = ip.parse().unwrap();
            assert_eq!(ip_id(ip), format!("ip:{ip}"));
        }
    }

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
        let before = blake3::keyed_hash(crate::serve::identify::hash::KEY, b"Bearer T0ken");
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

    /// The identify phase asks only where a source asks the backend: a
    /// guarded route whose caller is a header (or a cookie, a JWT) is
    /// read by its layers alone, not hashed once more before them.
    #[test]
    fn only_a_source_that_asks_the_backend_is_read_in_the_identify_phase() {
        let asks = |identity: &str| {
            let yaml = format!(
                "upstream: http://127.0.0.1:9\nidentity: {identity}\nroutes:\n  - match: POST /orders\n    guard: fingerprint\n"
            );
            let config = crate::config::Config::parse("g.yaml", yaml.as_bytes()).unwrap();
            Caller::asking(&config.identity, &config.upstream)
                .on_route(&config.routes[0])
                .asks()
        };
        assert_eq!(asks("{ header: X-User-Id }"), Asks::Never);
        assert_eq!(asks("{ cookie: session }"), Asks::Never);
        let introspect = "{ introspect: { path: /who, user: { json: /id } } }";
        assert_eq!(asks(introspect), Asks::Refusing);
        assert_eq!(
            asks(&format!(
                "{{ any_of: [{{ header: X-User-Id }}, {introspect}] }}"
            )),
            Asks::Refusing
        );
    }

    fn caller_of(yaml: &str) -> Caller {
        let text = format!("upstream: http://127.0.0.1:9\n{yaml}");
        let env = |name: &str| (name == "S").then(|| vec![b's'; 32]);
        let config = crate::config::Config::parse_in("g.yaml", text.as_bytes(), &env)
            .unwrap_or_else(|p| panic!("{p}"));
        Caller::new(&config.identity)
    }

    fn with_headers(caller: &Caller, headers: &[(&str, &str)]) -> Option<String> {
        let mut req = http::Request::get("/");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        caller.identify(&req.body(()).unwrap().into_parts().0)
    }

    #[test]
    fn one_named_cookie_across_every_cookie_header() {
        let caller = caller_of("identity: { cookie: sid, required: true }\n");
        let id = |lines: &[&str]| {
            let h: Vec<(&str, &str)> = lines.iter().map(|l| ("cookie", *l)).collect();
            with_headers(&caller, &h)
        };
        let abc = id(&["sid=abc"]).unwrap();
        assert!(abc.starts_with("c:") && !abc.contains("abc"));
        for lines in [
            &["_ga=1; sid=abc"][..],
            &["sid=abc;_ga=2"],
            &["_ga=3", "sid=abc"],
            &[" sid = abc ; theme=dark"],
            &["sid=\"abc\""],
            &["sid=abc", "sid=abc"],
        ] {
            assert_eq!(id(lines).as_ref(), Some(&abc), "{lines:?}");
        }
        for lines in [
            &["sid=abc; sid=xyz"][..],
            &["sid=abc", "sid=xyz"],
            &["sid="],
            &["sids=abc"],
            &["SID=abc"],
            &["_ga=1"],
            &[],
        ] {
            assert_eq!(id(lines), None, "{lines:?}");
        }
        let long = format!("sid={}", "a".repeat(4097));
        assert_eq!(id(&[&long]), None);
    }

    /// The finding: `sid=abc`, `sid="abc"`, `sid="\141bc"` and `sid=%61bc`
    /// are one session to werkzeug, Python's `http.cookies` or Express's
    /// `cookie`, and were three callers (one key paid three times, one
    /// rate limit spent three times over). Every spelling of `abc` is the
    /// caller `abc` now, hashed as `abc` was before (its records stay its
    /// own); other values stay other callers.
    #[test]
    fn every_spelling_of_a_cookie_value_is_one_caller() {
        let caller = caller_of("identity: { cookie: sid, required: true }\n");
        let id = |lines: &[&str]| {
            let h: Vec<(&str, &str)> = lines.iter().map(|l| ("cookie", *l)).collect();
            with_headers(&caller, &h)
        };
        let abc = id(&["sid=abc"]).unwrap();
        let before = blake3::keyed_hash(crate::serve::identify::hash::KEY, b"abc");
        assert_eq!(abc, format!("c:{}", &before.to_hex()[..32]));
        for lines in [
            &[r#"sid="abc""#][..],
            &[r#"sid="\141bc""#],
            &[r#"sid="\141\142\143""#],
            &[r#"sid="\a\b\c""#],
            &["sid=%61bc"],
            &["sid=%61%62%63"],
            &[r#"sid="%61bc""#],
            &[r#"sid="\%61bc""#],
            &[r#"sid= "ab\c" "#],
            // One value in two spellings is not two values.
            &["sid=abc; sid=%61bc"],
            &["_ga=1; sid=%61bc", r#"sid="\141bc""#],
        ] {
            assert_eq!(id(lines).as_ref(), Some(&abc), "{lines:?}");
        }
        for lines in [
            &["sid=abd"][..],
            // Unquoted, a backslash is itself (to Python and Express).
            &[r"sid=\141bc"],
            // Decoded once: `%2561` is `%61`.
            &["sid=%2561bc"],
            // Quotes percent-encoded are the value's own.
            &["sid=%22abc%22"],
            // `+` is not a space (decodeURIComponent).
            &["sid=a+c"],
        ] {
            let other = id(lines);
            assert!(other.is_some() && other != Some(abc.clone()), "{lines:?}");
        }
        for lines in [
            // A quote left open: read three ways, so none.
            &[r#"sid="abc1"#][..],
            &[r#"sid=""#],
            &[r#"sid="abc"x"#],
            // Python and werkzeug read `a;b` here, the others `"a`.
            &[r#"sid="a;b""#],
            &["sid=abc", r#"sid="abc"#],
            // Two values, however spelled.
            &["sid=abc; sid=%62bc"],
            &[r#"sid="""#],
        ] {
            assert_eq!(id(lines), None, "{lines:?}");
        }
        // The limit is the value's: 4 KiB escaped thrice over is 4 KiB.
        let escaped = format!("sid={}", "%61".repeat(4096));
        assert_eq!(id(&[&escaped]), id(&[&format!("sid={}", "a".repeat(4096))]));
        assert!(id(&[&escaped]).is_some());
    }

    /// Each step of [`cookie_value`], checked against what Python's
    /// `http.cookies._unquote` (and werkzeug) and `decodeURIComponent`
    /// give; a plain value is borrowed, never copied.
    #[test]
    fn a_cookie_value_is_read_as_the_frameworks_read_it() {
        let read = |v: &str| cookie_value(v.as_bytes()).map(Cow::into_owned);
        let is = |v: &str, want: &[u8]| assert_eq!(read(v).as_deref(), Some(want), "{v}");
        // Python: _unquote('"\\400"') == '400', '"\\18"' == '18',
        // '"\\\\141"' == '\\141', '"abc\\"' == 'abc\\', '"\\"' == '\\'.
        is(r#""\400""#, b"400");
        is(r#""\18""#, b"18");
        is(r#""\\141""#, br"\141");
        is(r#""abc\""#, br"abc\");
        is(r#""\""#, br"\");
        is(r#""\"q\"""#, br#""q""#);
        // Bytes stay bytes: werkzeug turns bytes that are not UTF-8 into
        // U+FFFD, which would make two values one.
        is(r#""\377\000""#, b"\xff\0");
        // UTF-8, escaped either way, or sent as it is.
        is(r#""\303\251""#, "é".as_bytes());
        is("%C3%A9", "é".as_bytes());
        is("%c3%a9", "é".as_bytes());
        // decodeURIComponent refuses these: the value as sent.
        for v in [
            "%ZZ",
            "%6",
            "a%",
            "%FF",
            "%C3",
            "%C3x%A9",
            "%ED%A0%80",
            "%C0%80",
        ] {
            is(v, v.as_bytes());
        }
        is("%25FF", b"%FF");
        is("s%3Aabc.sig%2B%2F", b"s:abc.sig+/");
        is("a+b c", b"a+b c");
        assert!(matches!(cookie_value(b"abc"), Some(Cow::Borrowed(b"abc"))));
        assert!(matches!(
            cookie_value(b"\"abc\""),
            Some(Cow::Borrowed(b"abc"))
        ));
        assert!(matches!(cookie_value(br"a\b"), Some(Cow::Borrowed(_))));
        assert_eq!(read("\""), None);
        assert_eq!(read("\"abc"), None);
    }

    #[test]
    fn each_kind_of_source_is_its_own_space() {
        let cookie = caller_of("identity: { cookie: sid }\n");
        let header = caller_of("identity: { header: X-User-Id }\n");
        let c = with_headers(&cookie, &[("cookie", "sid=42")]).unwrap();
        let h = with_headers(&header, &[("x-user-id", "42")]).unwrap();
        assert_ne!(c, h);
        assert_eq!(
            c[2..],
            h[2..],
            "the same hash of the same value, apart by kind"
        );
        let any = caller_of("identity: { any_of: [{ cookie: sid }, { header: X-User-Id }] }\n");
        assert_eq!(
            with_headers(&any, &[("cookie", "sid=42"), ("x-user-id", "7")]),
            Some(c)
        );
        assert_eq!(with_headers(&any, &[("x-user-id", "42")]), Some(h));
        // Neither, not required: the address (none here: no peer).
        assert_eq!(with_headers(&any, &[]), None);
    }

    fn hs256(claims: &serde_json::Value) -> String {
        let key = jsonwebtoken::EncodingKey::from_secret(&[b's'; 32]).unwrap();
        let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        format!(
            "Bearer {}",
            jsonwebtoken::encode(&header, claims, &key).unwrap()
        )
    }

    #[test]
    fn a_jwt_that_does_not_verify_ends_the_search() {
        let caller = caller_of(
            "identity:\n  any_of: [{ jwt: { secret_env: S } }, { cookie: sid }, { ip: true }]\n",
        );
        let exp = jsonwebtoken::get_current_timestamp() + 60;
        let good = hs256(&serde_json::json!({"sub": "u1", "exp": exp}));
        let refreshed = hs256(&serde_json::json!({"sub": "u1", "exp": exp + 60}));
        let numeric = hs256(&serde_json::json!({"sub": 42, "exp": exp}));
        let other_iss = hs256(&serde_json::json!({"sub": "u1", "iss": "b", "exp": exp}));
        let j = with_headers(&caller, &[("authorization", &good)]).unwrap();
        assert!(j.starts_with("j:"));
        assert_eq!(
            with_headers(&caller, &[("authorization", &refreshed)]),
            Some(j.clone())
        );
        assert!(with_headers(&caller, &[("authorization", &numeric)]).is_some());
        assert_ne!(
            with_headers(&caller, &[("authorization", &other_iss)]),
            Some(j)
        );
        let cookie = ("cookie", "sid=abc");
        for bad in [
            "Bearer not-a-jwt",
            "Bearer",
            "Bearer a b",
            &hs256(&serde_json::json!({"sub": "u1", "exp": 1})),
            &hs256(&serde_json::json!({"sub": ["u1"], "exp": exp})),
        ] {
            assert_eq!(
                with_headers(&caller, &[("authorization", bad), cookie]),
                None,
                "{bad}"
            );
        }
        assert_eq!(
            with_headers(
                &caller,
                &[("authorization", &good), ("authorization", &good)]
            ),
            None,
            "two credentials"
        );
        // Another scheme is no JWT: the cookie is read.
        assert!(
            with_headers(&caller, &[("authorization", "Basic dTox"), cookie])
                .is_some_and(|id| id.starts_with("c:"))
        );
    }
}
