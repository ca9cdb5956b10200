// Over 400 lines on purpose: the typed file and its docs (each field with its default, as the README gives it).
//! The gateway's file (the README's "The file") as typed Rust.
//!
//! [`Config::parse`] reads the YAML text into a tree whose every node
//! knows its line and column, then walks it field by field, collecting
//! every problem (an unknown field is one: nothing is ignored) before it
//! answers, so `check` names them all at once instead of the first.
//!
//! ```
//! use norepeat_gateway::config::{Config, Guard, OnStoreFailure};
//! use std::time::Duration;
//!
//! let config = Config::parse("gateway.yaml", br#"
//! upstream: http://127.0.0.1:9000
//! routes:
//!   - match: POST /payments
//!     guard: idempotency
//!     retention: 1h
//! "#)?;
//! let route = &config.routes[0];
//! assert!(route.matcher.matches("POST", "/payments"));
//! assert_eq!(route.on_store_failure, OnStoreFailure::Closed);
//! assert!(matches!(route.guard, Some(Guard::Idempotency { retention, .. })
//!     if retention == Duration::from_secs(3600)));
//! assert_eq!(route.timeout, Duration::from_secs(30));
//! # Ok::<(), norepeat_gateway::config::Problems>(())
//! ```
//!
//! A bad file gets one line per problem, each naming the file, the line
//! and column, and the field (`routes[0]` is the first route):
//!
//! ```
//! use norepeat_gateway::config::Config;
//!
//! let problems = Config::parse("gateway.yaml", b"
//! upstream: http://127.0.0.1:9000
//! routes:
//!   - match: POST /orders
//!     guard: token
//!     window: 3s
//!   - match: POST /b
//!     rate_limit: { rate: 5/d }
//! ").unwrap_err();
//! assert_eq!(problems.to_string(), "\
//! gateway.yaml:6:13: routes[0].window: only a fingerprint route has a window (this route's guard is token)
//! gateway.yaml:8:25: routes[1].rate_limit.rate: the unit of a rate must be s, m or h, not \"d\"
//! ");
//! ```
//!
//! # Defaults
//!
//! | field | default |
//! |---|---|
//! | `listen` | `127.0.0.1:8090` |
//! | `store` | `memory` |
//! | `identity` | the peer address (`ip`), no trusted proxies, not required |
//! | `identity.jwt.claim` | `sub` |
//! | `identity.jwt.issuer`, `audiences` | not checked |
//! | `identity.introspect.cache` | `60s` |
//! | `identity.introspect.timeout` | `500ms` |
//! | `token_secret` | `NOREPEAT_GATEWAY_TOKEN_SECRET`, else a random one kept in the store |
//! | `token_ttl` | `60s` |
//! | `cors.allow_origins` | none (no page of another origin may call a route or ask for a token) |
//! | `error_page` | none: a browser's refusal is the gateway's own small page |
//! | `routes[].identity` | the file's `identity` |
//! | `routes[].content_type` | none: every request body's type |
//! | `routes` | none (every request passes through) |
//! | `routes[].upstream` | the file's `upstream` |
//! | `routes[].on_store_failure` | `closed` for idempotency, `open` otherwise |
//! | `routes[].shadow` | `false` |
//! | `routes[].window` (fingerprint) | `3s`, the library's |
//! | `routes[].ignore_fields` (fingerprint) | none of the file's; the library's four are left out too (below) |
//! | `routes[].ignore_default_fields` (fingerprint) | `true`: `traceId`, `timestamp`, `random` and `sign` are left out of the fingerprint; `false` makes them count |
//! | `routes[].required` (idempotency) | `true` |
//! | `routes[].retention` (idempotency) | `24h` |
//! | `routes[].ambiguous` (idempotency) | `keep` |
//! | `routes[].on_repeat` (token, fingerprint) | `refuse`: a repeat gets 409 |
//! | `routes[].wait` (`on_repeat: replay`) | `5s` |
//! | `routes[].reconcile` (idempotency) | none: an unknown outcome stays unknown (409) until its record ends or an operator clears it |
//! | `routes[].max_request_body` | `64KiB` |
//! | `routes[].max_stored_response` | `1MiB` |
//! | `routes[].timeout` | `30s` |
//! | `rate_limit.algorithm` | `gcra` |
//! | `rate_limit.burst` (gcra only) | the rate's count |
//! | `rate_limit.by` | `identity` |
//! | `hosts` | none: every Host is served, keys scoped by the one it names |
//! | `records` | none: the idempotency records are kept on `store` |
//! | `on_data_loss.hold` | `0s`: off |
//! | `upgrades` | `[websocket]` (`h2c` is refused) |
//! | `limits` | `header_timeout: 10s`, `idle_timeout: 60s`, `body_timeout: 30s`, `request_timeout: 60s`, `max_connections: 10000`, `max_streams: 100` |
//! | `tls` | none: plain HTTP/1.1 and cleartext HTTP/2 (prior knowledge) |
//! | `upstream_ca` | none: an `https://` upstream is checked against the system's roots |
//! | `health_check` | none: only a refused connection takes a server out, for 10 s (`interval`: `5s`) |
//!
//! `upstream`, `routes[].match` and `rate_limit.rate` have none. `listen`
//! is an IP address and a port (`127.0.0.1:0` picks a free port; quote an
//! IPv6 one, `"[::1]:8090"`); an `upstream` is `http://host[:port][/base]` or `https://...`, or a
//! list of them (`[http://a:8000, http://b:8000]`, one path for all).
//! A misspelt field gets the nearest known name (`did you mean window?`). Durations
//! are the library's grammar ([`norepeat::attribute::parse_duration`]:
//! `250ms`, `3s`, `5m`, `24h`, `7d`), rates its [`Quota::parse`] (`5/s`,
//! `120/m`, `1000/h`), sizes a whole number of bytes or one with `B`,
//! `KiB`, `MiB` or `GiB` (`64KiB`).

mod error_page;
mod parse;
mod path;
mod route_match;
mod tls;
mod walk;

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

pub use error_page::{ErrorPage, MAX_ERROR_PAGE, PLACEHOLDERS};
pub use ipnet::IpNet;
pub use norepeat::ratelimit::{Algorithm, Quota};
pub(crate) use path::host_span;
pub use path::{
    normalize_host, normalize_path, route_spelling, with_slashes_decoded, without_format_suffix,
};
pub use route_match::{METHODS, MediaType, RouteMatch};
pub(crate) use tls::certified_key;
pub use tls::{Tls, UpstreamCa};

/// The environment variable that gives the token secret when the file
/// does not.
pub const TOKEN_SECRET_ENV: &str = "NOREPEAT_GATEWAY_TOKEN_SECRET";

/// The shortest token secret accepted, in bytes.
pub const MIN_TOKEN_SECRET: usize = 32;

/// A whole configuration file, defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// Where the gateway listens (`listen`).
    pub listen: SocketAddr,
    /// Where every request goes unless its route says otherwise.
    pub upstream: Upstream,
    /// `health_check`: the upstream servers asked, in the background,
    /// whether they are up (`None`: only a refused connection takes a
    /// server out, for 10 s).
    pub health_check: Option<HealthCheck>,
    /// Where the guards keep their keys.
    pub store: StoreUrl,
    /// Who the caller is.
    pub identity: Identity,
    /// What signs the tokens; `None` when neither the file nor
    /// [`TOKEN_SECRET_ENV`] gives one (the store then keeps a random one).
    pub token_secret: Option<TokenSecret>,
    /// What one client connection may hold (`limits`).
    pub limits: Limits,
    /// `token_ttl` (60 s): the life of a repeat token.
    pub token_ttl: Duration,
    /// `cors`: the pages of other origins that may call the routes and
    /// ask `GET /.norepeat/token`.
    pub cors: Cors,
    /// `error_page`: the page a browser's navigation gets for a refusal
    /// (`None`: the gateway's own).
    pub error_page: Option<ErrorPage>,
    /// The routes, in order: the first that matches a request takes it.
    pub routes: Vec<Route>,
    /// Whether the file has a `routes` key. A reload that would remove
    /// every route is refused unless the file says so (`routes: []`): a
    /// file caught half-written, or cut short, has no routes either.
    pub routes_given: bool,
    /// `tls: { cert, key }`: HTTPS on the listener (HTTP/2 offered by
    /// ALPN); `None` serves plain HTTP. Read at start; the two files are
    /// read again when they change.
    pub tls: Option<Tls>,
    /// `upstream_ca`: the PEM file of the certificate authorities an
    /// `https://` upstream is checked against, instead of the system's.
    pub upstream_ca: Option<UpstreamCa>,
    /// `drain_delay` (5 s): after `SIGTERM`, how long readiness answers
    /// 503 while the listener still accepts, so a load balancer takes the
    /// instance out before it stops accepting.
    pub drain_delay: Duration,
    /// `access_log` (off): where one JSON line per request goes.
    pub access_log: AccessLog,
    /// `admin`: a second listener for the gateway's own routes and the
    /// key records, if any.
    pub admin: Option<Admin>,
    /// `hosts`: the site's names, in [`normalize_host`]'s spelling. Keys
    /// are scoped to the site, whichever of its names a request used; a
    /// request for any other Host is answered 421 `misdirected_request`.
    /// Empty (the default): every Host is served, and keys are scoped by
    /// the one it names.
    pub hosts: Vec<String>,
    /// `records`: where the idempotency routes keep their records (claims,
    /// answers, unknown outcomes), apart from `store`: a database, which
    /// outlives a cache that forgets (a Redis without persistence,
    /// restarted). `None`: on `store` with the other guards.
    pub records: Option<RecordsUrl>,
    /// `on_data_loss.hold` (0: off): for this long after the store was
    /// found to have lost its data, the idempotency routes whose records
    /// it kept answer 503 `records_lost` instead of running retries of
    /// requests made before the loss.
    pub on_data_loss_hold: Duration,
    /// `upgrades` (`[websocket]`): the `Upgrade` protocols forwarded, in
    /// lower case; any other is dropped from the request (it goes on as a
    /// plain request). `h2c` is refused in the file.
    pub upgrades: Vec<String>,
}

/// `upgrades`' default: WebSocket only.
#[must_use]
pub fn default_upgrades() -> Vec<String> {
    vec!["websocket".to_owned()]
}

/// The fields read at start only: a reload that changes one logs that it
/// waits for a restart, and applies the rest of the file. Listed once
/// here: a new start-only field is one more name in this list. (`store`
/// is refused outright by a reload: another store is another set of
/// records.)
macro_rules! start_only {
    ($($field:ident),* $(,)?) => {
        impl Config {
            /// The names of the fields read at start only.
            pub const START_ONLY: &'static [&'static str] = &[$(stringify!($field)),*];

            /// The start-only fields that differ between this file and
            /// `running` (what a reload applies and what it leaves).
            #[must_use]
            pub fn start_only_changed(&self, running: &Config) -> Vec<&'static str> {
                let mut changed = Vec::new();
                $(if self.$field != running.$field {
                    changed.push(stringify!($field));
                })*
                changed
            }

            /// Takes `running`'s start-only fields: the file in effect
            /// after a reload.
            pub fn keep_start_only(&mut self, running: &Config) {
                $(self.$field.clone_from(&running.$field);)*
            }
        }
    };
}

start_only!(
    listen,
    records,
    tls,
    upstream_ca,
    health_check,
    limits,
    drain_delay,
    access_log,
    admin
);

/// How long readiness answers 503 before the listener stops accepting.
pub const DEFAULT_DRAIN_DELAY: Duration = Duration::from_secs(5);

/// `access_log`: where one JSON line per request is written.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AccessLog {
    /// `off` (the default).
    Off,
    /// `stdout`.
    Stdout,
    /// `stderr`.
    Stderr,
    /// A file's path, appended to (created if missing).
    File(std::path::PathBuf),
}

/// `admin: { listen, token_env }`: a second listener that serves the
/// gateway's own routes (`/.norepeat/healthz`, `readyz`, `metrics`) apart
/// from the traffic, and, to a caller with the token, one key's record
/// (`GET` and `DELETE /.norepeat/admin/records/...`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Admin {
    /// `listen`: where the admin listener listens.
    pub listen: SocketAddr,
    /// `token_env`: the environment variable holding the admin token
    /// (sent as `Norepeat-Admin-Token: TOKEN`); unset, the record routes
    /// are not served.
    pub token_env: Option<String>,
    /// `public`: the gateway's own routes served on the traffic's listener
    /// too (of [`Admin::PUBLISHABLE`]); by default none but the token
    /// route, which always is.
    pub public: Vec<String>,
}

impl Admin {
    /// The own routes that `public` may keep on the traffic's listener.
    pub const PUBLISHABLE: [&'static str; 3] = ["healthz", "readyz", "metrics"];
}

/// `limits:`: what a client connection may hold of the gateway, so a
/// connection costs nothing it cannot take back (defaults in line with
/// NGINX and Envoy). Read at start: a change needs a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// `header_timeout` (10 s): a request head must have arrived this long
    /// after its first byte (or after the connection was accepted); else
    /// the connection is closed. NGINX's `client_header_timeout`.
    pub header_timeout: Duration,
    /// `idle_timeout` (60 s): a connection with no request in flight and no
    /// byte of a next one is closed after this. NGINX's
    /// `keepalive_timeout`, Envoy's `idle_timeout`.
    pub idle_timeout: Duration,
    /// `body_timeout` (30 s): the longest pause between two pieces of a
    /// request body; a body that stalls longer fails (the request is
    /// answered as a broken body). NGINX's `client_body_timeout`.
    pub body_timeout: Duration,
    /// `request_timeout` (60 s): the whole request, head and body, from
    /// its first byte; a body still coming then fails as a stalled one
    /// does. A body trickled a byte at a time never pauses past
    /// `body_timeout`, and is cut here. HAProxy's `timeout http-request`.
    pub request_timeout: Duration,
    /// `max_connections` (10000): client connections open at once; past
    /// it, new ones wait in the listen queue until one closes.
    pub max_connections: std::num::NonZeroU32,
    /// `max_streams` (100): the requests one HTTP/2 connection may have
    /// open at once (its `SETTINGS_MAX_CONCURRENT_STREAMS`), so one client
    /// connection holds at most this many backend connections. NGINX's
    /// `http2_max_concurrent_streams` (128).
    pub max_streams: std::num::NonZeroU32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(60),
            max_connections: std::num::NonZeroU32::new(10_000).unwrap_or(std::num::NonZeroU32::MIN),
            max_streams: std::num::NonZeroU32::new(100).unwrap_or(std::num::NonZeroU32::MIN),
        }
    }
}

/// One entry of `routes`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Route {
    /// `match`: the requests this route takes.
    pub matcher: RouteMatch,
    /// `host`: the one site (`Host`, in [`normalize_host`]'s spelling)
    /// whose requests this route takes; `None` takes every site's.
    pub host: Option<String>,
    /// `content_type`: the one media type of the bodies this route takes;
    /// `None` takes every request, whatever its `Content-Type`.
    pub content_type: Option<MediaType>,
    /// `guard`, with its own fields.
    pub guard: Option<Guard>,
    /// `rate_limit`.
    pub rate_limit: Option<RateLimit>,
    /// `shadow`: decide and count, never refuse.
    pub shadow: bool,
    /// The route's `upstream`, or the file's.
    pub upstream: Upstream,
    /// What a store that does not answer does to the request.
    pub on_store_failure: OnStoreFailure,
    /// The largest request body the route reads, in bytes.
    pub max_request_body: u64,
    /// The largest answer kept for a replay, in bytes.
    pub max_stored_response: u64,
    /// How long the upstream has to answer.
    pub timeout: Duration,
    /// The route's own `identity` (its `trusted_proxies` are the file's);
    /// `None` takes the file's.
    pub identity: Option<Identity>,
    /// `on_repeat: replay` on a token or fingerprint route: a repeat gets
    /// the first answer, waiting up to this long (`wait`) while the first
    /// is still at the backend; `None` (`refuse`, the default): 409.
    pub on_repeat: Option<Duration>,
}

/// `guard:` and the fields that belong to it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Guard {
    /// `guard: token`: `GET /.norepeat/token` issues, `Repeat-Token`
    /// consumes.
    Token,
    /// `guard: fingerprint`: the same body twice within `window` is a
    /// duplicate.
    Fingerprint {
        /// How long a fingerprint is held.
        window: Duration,
        /// JSON fields left out of the fingerprint: the library's
        /// [`DEFAULT_IGNORED_FIELDS`](norepeat::fingerprint::DEFAULT_IGNORED_FIELDS)
        /// (unless `ignore_default_fields: false`), then the file's
        /// `ignore_fields`.
        ignore_fields: Vec<String>,
    },
    /// `guard: idempotency`: the `Idempotency-Key` header.
    Idempotency {
        /// A request without the header gets 400.
        required: bool,
        /// How long an answer is kept for replay.
        retention: Duration,
        /// What an unknown outcome does to the key.
        ambiguous: Ambiguous,
        /// `reconcile.lookup`: asked what became of an unknown outcome.
        reconcile: Option<Lookup>,
    },
}

/// `reconcile: { lookup: GET /payments/by-key/{key} }` of an idempotency
/// route: the backend's own record of an operation, by its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    /// The path, with `{key}` where the client's key goes (percent-encoded).
    pub path: String,
}

/// What the gateway knows of each guard, in one place: its name in the
/// file, its own fields, its default failure policy, whether its layer
/// reads the request body itself and whether it keeps answers. A new
/// guard is a variant here (with these answers) and a layer in the
/// route's stack.
impl Guard {
    /// The names the file gives the guards.
    pub const NAMES: [&'static str; 3] = ["token", "fingerprint", "idempotency"];

    /// The fields that belong to one guard: (field, its guard's name, what
    /// a problem calls it). On another route each is a problem.
    pub const FIELDS: [(&'static str, &'static str, &'static str); 7] = [
        ("window", "fingerprint", "a window"),
        ("ignore_fields", "fingerprint", "ignore_fields"),
        (
            "ignore_default_fields",
            "fingerprint",
            "ignore_default_fields",
        ),
        ("required", "idempotency", "required"),
        ("retention", "idempotency", "a retention"),
        ("ambiguous", "idempotency", "ambiguous"),
        ("reconcile", "idempotency", "reconcile"),
    ];

    /// The name the file gives the guard.
    #[must_use]
    pub const fn name(&self) -> &'static str {
        match self {
            Guard::Token => "token",
            Guard::Fingerprint { .. } => "fingerprint",
            Guard::Idempotency { .. } => "idempotency",
        }
    }

    /// `on_store_failure`'s default for the guard named `name`: an
    /// idempotency route refuses while its records cannot be read (a
    /// retry would run again), the others let requests through.
    #[must_use]
    pub fn default_on_store_failure(name: &str) -> OnStoreFailure {
        if name == "idempotency" {
            OnStoreFailure::Closed
        } else {
            OnStoreFailure::Open
        }
    }

    /// Whether the guard's layer reads the request body itself (under the
    /// route's `max_request_body`): the fingerprint's and the key's
    /// mismatch check do; a token route streams it.
    #[must_use]
    pub const fn reads_body(&self) -> bool {
        matches!(self, Guard::Fingerprint { .. } | Guard::Idempotency { .. })
    }

    /// Whether the guard keeps the upstream's answers (for replay): its
    /// answer is read ahead, so one that breaks off is told from a whole
    /// one while its outcome can still be recorded.
    #[must_use]
    pub const fn keeps_answers(&self) -> bool {
        matches!(self, Guard::Idempotency { .. })
    }

    /// Whether an unknown outcome is kept as the key's record
    /// (`ambiguous: keep`).
    #[must_use]
    pub const fn keeps_unknown_outcomes(&self) -> bool {
        matches!(
            self,
            Guard::Idempotency {
                ambiguous: Ambiguous::Keep,
                ..
            }
        )
    }
}

/// `ambiguous:` of an idempotency route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ambiguous {
    /// The unknown outcome is recorded: every retry gets 409
    /// `idempotency_outcome_unknown` until the retention ends.
    #[default]
    Keep,
    /// The key is freed, so a retry runs again.
    Release,
}

/// `on_store_failure:` of a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnStoreFailure {
    /// The request goes on unguarded.
    Open,
    /// The request gets 503 `guard_unavailable`.
    Closed,
}

/// `rate_limit:` of a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateLimit {
    /// `algorithm`: `fixed`, `sliding` or `gcra`.
    pub algorithm: Algorithm,
    /// `rate` with `burst` applied.
    pub quota: Quota,
    /// `by`: whose requests are counted together.
    pub by: LimitBy,
}

/// `rate_limit.by`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitBy {
    /// The caller as `identity` names it.
    Identity,
    /// The client's address (`address` or `ip`), whatever the identity.
    Address,
}

/// `identity:` (the file's, or a route's own).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Identity {
    /// Where the caller's name is read.
    pub source: IdentitySource,
    /// Proxies whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<IpNet>,
    /// A guarded request without an identity gets 401.
    pub required: bool,
}

/// Where the caller is read: `ip: true`, `header`, `cookie`, `jwt`,
/// `introspect` or `any_of`. Each value is hashed with its kind, so a cookie's value and a
/// header's never name one caller.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum IdentitySource {
    /// `ip: true`: the peer address (from `X-Forwarded-For` when the peer
    /// is a trusted proxy).
    #[default]
    PeerAddress,
    /// `header: NAME`: a header's value, hashed (the header name, lower
    /// case).
    Header(String),
    /// `cookie: NAME`: one named cookie's value, hashed (every `Cookie`
    /// header read as one list, as HTTP/2 splits them).
    Cookie(String),
    /// `jwt: {...}`: a claim of a bearer JWT whose signature verifies.
    Jwt(Jwt),
    /// `introspect: {...}`: the user the backend names when asked with
    /// the client's `Cookie` and `Authorization`.
    Introspect(Introspect),
    /// `any_of: [...]`: the first of these sources the request carries.
    AnyOf(Vec<IdentitySource>),
}

/// `identity.jwt`: a claim of a verified `Authorization: Bearer` JWT.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Jwt {
    /// `claim` (`sub`): the claim whose value names the caller.
    pub claim: String,
    /// What verifies the signature.
    pub keys: JwtKeys,
    /// `issuer`: when set, the `iss` the token must carry.
    pub issuer: Option<String>,
    /// `audiences`: when set, the token's `aud` must name one of them.
    pub audiences: Vec<String>,
}

/// `identity.introspect`: ask the backend who the caller is, as NGINX's
/// `auth_request` and Traefik's `forwardAuth` do.
///
/// ```
/// use norepeat_gateway::config::{
///     Config, DEFAULT_INTROSPECT_CACHE, DEFAULT_INTROSPECT_TIMEOUT, IdentitySource, IntrospectUser,
/// };
/// use std::time::Duration;
///
/// let config = Config::parse("g.yaml", b"
/// upstream: http://127.0.0.1:9000
/// identity: { introspect: { path: /api/whoami, user: { json: /user/id } } }
/// ")?;
/// let IdentitySource::Introspect(i) = &config.identity.source else { panic!() };
/// assert_eq!(i.path, "/api/whoami");
/// assert_eq!(i.user, IntrospectUser::Json("/user/id".into()));
/// assert_eq!((i.cache, i.timeout), (DEFAULT_INTROSPECT_CACHE, DEFAULT_INTROSPECT_TIMEOUT));
/// assert_eq!(DEFAULT_INTROSPECT_TIMEOUT, Duration::from_millis(500));
/// # Ok::<(), norepeat_gateway::config::Problems>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Introspect {
    /// `path`: what is asked (`GET`), on the route's upstream; a path
    /// and an optional query.
    pub path: String,
    /// `user`: where the 200 names the user.
    pub user: IntrospectUser,
    /// `cache`: how long an answer is kept per credential.
    pub cache: Duration,
    /// `timeout`: how long the backend has to answer, body included.
    pub timeout: Duration,
}

/// The default `identity.introspect.cache`.
pub const DEFAULT_INTROSPECT_CACHE: Duration = Duration::from_secs(60);

/// The default `identity.introspect.timeout`.
pub const DEFAULT_INTROSPECT_TIMEOUT: Duration = Duration::from_millis(500);

/// `identity.introspect.user`: where the backend's 200 names the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IntrospectUser {
    /// `{ header: NAME }`: a header of the answer (the name, lower case).
    Header(String),
    /// `{ json: /pointer }`: a string or a number at this JSON pointer
    /// (RFC 6901) of the answer's body.
    Json(String),
}

/// `secret_env` or `public_keys` of `identity.jwt`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwtKeys {
    /// `secret_env: NAME`: HS256 with the variable's value (at least 32
    /// bytes, RFC 7518 §3.2).
    Secret {
        /// The variable's name.
        env: String,
        /// Its value.
        secret: JwtSecret,
    },
    /// `public_keys: FILE`: RS256 and ES256 public keys, PEM or JWKS
    /// (a relative path is the file's directory's), re-read on change.
    PublicKeys(std::path::PathBuf),
}

/// An HS256 secret; its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct JwtSecret(Vec<u8>);

impl JwtSecret {
    /// The secret's bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for JwtSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JwtSecret({} bytes)", self.0.len())
    }
}

/// `cors:`: the origins whose pages may call the routes and
/// `GET /.norepeat/token` (with credentials, so a cookie identity works
/// from them).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Cors {
    /// `allow_origins`, each `scheme://host[:port]` in lower case.
    pub allow_origins: Vec<String>,
}

/// The default `token_ttl`.
pub const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(60);

/// `store:`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StoreUrl {
    /// `memory`: one process's own store.
    #[default]
    Memory,
    /// `redis://...` or `rediss://...`, as written.
    Redis(String),
    /// `redis+cluster://h:p,h:p`, as written.
    Cluster(String),
}

impl StoreUrl {
    /// The URL to hand to `norepeat::store::AnyStore::from_url` (`None`
    /// for memory).
    #[must_use]
    pub fn as_url(&self) -> Option<&str> {
        match self {
            StoreUrl::Memory => None,
            StoreUrl::Redis(u) | StoreUrl::Cluster(u) => Some(u),
        }
    }
}

/// `records:`: the database that keeps the idempotency routes' records,
/// as written (`postgres://...`, or `sqlite:FILE`, its path relative to
/// the file's folder resolved).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordsUrl(String);

impl RecordsUrl {
    /// The URL to hand to `norepeat::store::AnyStore::from_url`.
    #[must_use]
    pub fn as_url(&self) -> &str {
        &self.0
    }
}

/// An `http://host:port[/base]` (or `https://`) upstream: one server, or
/// a list of them (`upstream: [http://a:8000, http://b:8000]`) that the
/// requests are spread over.
///
/// ```
/// let file = b"upstream: [http://10.0.0.1:8000, http://10.0.0.2:8000]\n";
/// let config = norepeat_gateway::config::Config::parse("g.yaml", file).unwrap();
/// let servers: Vec<&str> = config.upstream.servers().map(|s| s.as_str()).collect();
/// assert_eq!(servers, ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]);
/// assert_eq!(config.upstream.as_str(), "http://10.0.0.1:8000");
/// ```
#[derive(Debug, Clone)]
pub struct Upstream(String, http::Uri, Vec<Upstream>);

impl Upstream {
    /// The URL as written, without a trailing `/` (a list's first).
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The URL parsed: it has a scheme (`http` or `https`) and an
    /// authority, no query (a list's first).
    #[must_use]
    pub fn uri(&self) -> &http::Uri {
        &self.1
    }

    /// Every server, in the file's order (one for a single URL).
    pub fn servers(&self) -> impl Iterator<Item = &Upstream> {
        std::iter::once(self).chain(self.2.iter())
    }

    /// `first` and then `rest`, as one upstream.
    pub(super) fn list(mut first: Upstream, rest: Vec<Upstream>) -> Self {
        first.2 = rest;
        first
    }
}

impl PartialEq for Upstream {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0 && self.2 == other.2
    }
}

impl Eq for Upstream {}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.2.is_empty() {
            return f.write_str(&self.0);
        }
        f.write_str("[")?;
        for (i, s) in self.servers().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(&s.0)?;
        }
        f.write_str("]")
    }
}

/// `health_check: {path, interval}`: every upstream server is asked
/// `GET path` every `interval` (within `min(interval, 2s)`); one that
/// does not answer 2xx takes no requests until it does again.
///
/// ```
/// use std::time::Duration;
///
/// let file = b"upstream: [http://a:8000, http://b:8000]\nhealth_check: { path: /health }\n";
/// let config = norepeat_gateway::config::Config::parse("g.yaml", file).unwrap();
/// let check = config.health_check.unwrap();
/// assert_eq!((check.path.as_str(), check.interval), ("/health", Duration::from_secs(5)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HealthCheck {
    /// The path asked (`/health`).
    pub path: String,
    /// How often (`5s`).
    pub interval: Duration,
}

/// The key that signs tokens; its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenSecret(Vec<u8>);

impl TokenSecret {
    /// The secret's bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for TokenSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TokenSecret({} bytes)", self.0.len())
    }
}

impl Config {
    /// Parses a file's bytes; `file` names it in the problems. The token
    /// secret comes from the file alone (see [`Config::parse_with_env`]).
    ///
    /// # Errors
    /// Every problem found, in the order of the file.
    pub fn parse(file: &str, bytes: &[u8]) -> Result<Self, Problems> {
        Self::parse_with_env(file, bytes, None)
    }

    /// As [`Config::parse`], with the value of [`TOKEN_SECRET_ENV`]
    /// (`env_secret`), used when the file has no `token_secret`: the
    /// file's wins.
    ///
    /// ```
    /// use norepeat_gateway::config::Config;
    ///
    /// let file = b"upstream: http://127.0.0.1:9000\n";
    /// let config = Config::parse_with_env("g.yaml", file, Some(&[b'k'; 32]))?;
    /// assert_eq!(config.token_secret.map(|s| s.as_bytes().len()), Some(32));
    /// let short = Config::parse_with_env("g.yaml", file, Some(b"short")).unwrap_err();
    /// assert!(short.to_string().starts_with("NOREPEAT_GATEWAY_TOKEN_SECRET: "));
    /// # Ok::<(), norepeat_gateway::config::Problems>(())
    /// ```
    ///
    /// # Errors
    /// Every problem found, in the order of the file, then the
    /// variable's.
    pub fn parse_with_env(
        file: &str,
        bytes: &[u8],
        env_secret: Option<&[u8]>,
    ) -> Result<Self, Problems> {
        Self::parse_in(file, bytes, &|name: &str| {
            (name == TOKEN_SECRET_ENV)
                .then(|| env_secret.map(<[u8]>::to_vec))
                .flatten()
        })
    }

    /// As [`Config::parse`], with the environment `env` (a variable's
    /// value by name): [`TOKEN_SECRET_ENV`], and the variable an
    /// `identity.jwt.secret_env` names. A relative `public_keys` path is
    /// read from `file`'s directory.
    ///
    /// ```
    /// use norepeat_gateway::config::{Config, IdentitySource};
    ///
    /// let file = b"upstream: http://127.0.0.1:9000\nidentity: { jwt: { claim: sub, secret_env: JWT_SECRET } }\n";
    /// let env = |name: &str| (name == "JWT_SECRET").then(|| vec![b'k'; 32]);
    /// let config = Config::parse_in("g.yaml", file, &env)?;
    /// assert!(matches!(config.identity.source, IdentitySource::Jwt(_)));
    /// let unset = Config::parse_in("g.yaml", file, &|_: &str| None).unwrap_err();
    /// assert!(unset.to_string().contains("identity.jwt.secret_env: JWT_SECRET is not set"));
    /// # Ok::<(), norepeat_gateway::config::Problems>(())
    /// ```
    ///
    /// # Errors
    /// Every problem found, in the order of the file, then the
    /// environment's.
    pub fn parse_in(
        file: &str,
        bytes: &[u8],
        env: &dyn Fn(&str) -> Option<Vec<u8>>,
    ) -> Result<Self, Problems> {
        parse::parse(file, bytes, env)
    }

    /// The route that takes a request: the first whose `match` matches
    /// the path once normalized ([`normalize_path`]), with its index;
    /// `None` passes the request through unguarded. A route's
    /// `content_type` is not looked at here (the body's type is the
    /// request's, not its path's).
    ///
    /// ```
    /// use norepeat_gateway::config::Config;
    ///
    /// let config = Config::parse("g.yaml", b"
    /// upstream: http://127.0.0.1:9000
    /// routes:
    ///   - match: POST /orders/quick
    ///     guard: fingerprint
    ///   - match: POST /orders/{id}
    ///     guard: token
    /// ")?;
    /// assert_eq!(config.route_for("POST", "/orders/quick").map(|(i, _)| i), Some(0));
    /// assert_eq!(config.route_for("POST", "/orders/7").map(|(i, _)| i), Some(1));
    /// assert_eq!(config.route_for("POST", "//orders/./quick/").map(|(i, _)| i), Some(0));
    /// assert!(config.route_for("GET", "/orders/7").is_none());
    /// # Ok::<(), norepeat_gateway::config::Problems>(())
    /// ```
    #[must_use]
    pub fn route_for(&self, method: &str, path: &str) -> Option<(usize, &Route)> {
        let path = normalize_path(path);
        self.routes
            .iter()
            .enumerate()
            .find(|(_, r)| r.matcher.matches(method, &path))
    }

    /// Reads and parses the file at `path`, with [`TOKEN_SECRET_ENV`]
    /// from the environment.
    ///
    /// # Errors
    /// The file cannot be read, or [`Config::parse_with_env`]'s.
    pub fn load(path: &Path) -> Result<Self, Problems> {
        let file = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| Problems {
            file: file.clone(),
            list: vec![Problem {
                line: None,
                column: None,
                field: String::new(),
                message: format!("cannot read the file: {e}"),
            }],
        })?;
        Self::parse_in(&file, &bytes, &|name: &str| {
            std::env::var_os(name).map(|v| v.as_encoded_bytes().to_vec())
        })
    }
}

/// One thing wrong with a file.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Problem {
    /// The line (from 1), when the problem has one.
    pub line: Option<usize>,
    /// The column (from 1), when known.
    pub column: Option<usize>,
    /// The field's path (`routes[2].window`; empty for the file itself).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// Every problem of one file; `Display` writes one line each,
/// `FILE:LINE:COLUMN: FIELD: MESSAGE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problems {
    file: String,
    list: Vec<Problem>,
}

impl Problems {
    /// The problems, in the order of the file.
    #[must_use]
    pub fn list(&self) -> &[Problem] {
        &self.list
    }

    /// The file's name as given.
    #[must_use]
    pub fn file(&self) -> &str {
        &self.file
    }
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for p in &self.list {
            // The environment variable is not in the file.
            if p.field != TOKEN_SECRET_ENV {
                f.write_str(&self.file)?;
                if let Some(line) = p.line {
                    write!(f, ":{line}")?;
                    if let Some(col) = p.column {
                        write!(f, ":{col}")?;
                    }
                }
                f.write_str(": ")?;
            }
            if !p.field.is_empty() {
                write!(f, "{}: ", p.field)?;
            }
            writeln!(f, "{}", p.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for Problems {}

/// The library's default fingerprint window.
const DEFAULT_WINDOW: Duration = Duration::from_secs(3);
/// The library's default idempotency retention.
const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
const DEFAULT_MAX_REQUEST_BODY: u64 = 64 * 1024;
const DEFAULT_MAX_STORED_RESPONSE: u64 = 1024 * 1024;
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_LISTEN: &str = "127.0.0.1:8090";

#[cfg(test)]
mod tests;
