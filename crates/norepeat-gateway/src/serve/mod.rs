//! Serving the file: the routes as tower stacks of the library's layers
//! over our own forwarding, the gateway's own routes, graceful shutdown.
//!
//! Every request is matched against the routes in order (first match
//! wins); a matched one goes through its route's rate limit, then its
//! guard, then to the upstream; an unmatched one streams through
//! unguarded. The answers are the layers' own, plus 502
//! `upstream_unavailable` and 504 `upstream_timeout` (RFC 9457).
//!
//! # An unknown outcome on an idempotency route (`ambiguous: keep`)
//! The library's layer frees a key when the handler answers a 5xx, so a
//! timed-out request is not answered 504 to the layer: the upstream
//! stage answers it `200` with no body and the header
//! [`OUTCOME_HEADER`]`: unknown`, which the layer stores as the key's
//! record (one atomic write of the layer's own, kept for `retention`, and
//! written before the key could be freed). The gateway answers the client
//! 504 `upstream_timeout`, and every retry with that key meets the
//! stored record and is answered 409 `idempotency_outcome_unknown`,
//! never reaching the backend. `ambiguous: release` answers the layer
//! 504, which frees the key; a 502 (nothing reached the backend) always
//! does.

mod caller;
mod forward;
mod own;
mod shadow;

pub use caller::Caller;
pub use forward::strip_hop_by_hop;
use forward::{Failure, HttpClient, client, forward};
pub use shadow::ShadowCounter;

use crate::config::{Ambiguous, Config, Guard, LimitBy, OnStoreFailure, Route, StoreUrl};
use arc_swap::ArcSwap;
use axum::body::Body;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use metrics_exporter_prometheus::PrometheusHandle;
use norepeat::degrade::FailurePolicy;
use norepeat::fingerprint::{
    DEFAULT_IGNORED_FIELDS, FingerprintGuard, FingerprintLayer, Fingerprinter,
};
use norepeat::idempotency::{DEFAULT_REPLAYED_HEADERS, IDEMPOTENT_REPLAYED, IdempotencyLayer};
use norepeat::problem::{Code, Problem};
use norepeat::ratelimit::{RateLimitLayer, RateLimiter};
use norepeat::store::{AnyStore, KeyValueStoreExt, Resilient, StoreError};
use norepeat::token::{TokenGuard, TokenLayer, TokenSigner};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt};

/// The store every route shares: the file's store behind the library's
/// time budget and circuit breaker.
pub type SharedStore = Resilient<AnyStore>;

/// A route's whole stack.
type RouteService = BoxCloneSyncService<Request<Body>, Response<Body>, Infallible>;

/// The header by which the upstream stage tells an idempotency layer's
/// record that the outcome is unknown (see the module docs). Never sent
/// to a client.
pub const OUTCOME_HEADER: HeaderName = HeaderName::from_static("norepeat-gateway-outcome");

/// How long an unmatched request's upstream has to answer.
const PASSTHROUGH_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the random token secret is kept when the file gives none.
const SECRET_KEY: &str = "norepeat:gateway:token-secret";

/// The gateway's state: compiled routes, the client, the store.
///
/// ```
/// use norepeat_gateway::config::Config;
/// use norepeat_gateway::serve::Gateway;
/// use tower::ServiceExt;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let config = Config::parse("g.yaml", b"
/// upstream: http://127.0.0.1:9
/// routes:
///   - match: POST /orders/quick
///     guard: fingerprint
/// ")?;
/// let app = Gateway::build(&config, None).await?.into_router();
/// let req = http::Request::get("/.norepeat/healthz").body(axum::body::Body::empty())?;
/// let res = app.oneshot(req).await?;
/// assert_eq!(res.status(), 200);
/// # Ok(()) }
/// ```
pub struct Gateway {
    /// What the file describes; swapped whole on a reload.
    live: ArcSwap<Routes>,
    client: HttpClient,
    store: SharedStore,
    store_url: StoreUrl,
    metrics: Option<PrometheusHandle>,
}

/// The part of the gateway a reload replaces.
struct Routes {
    list: Vec<Compiled>,
    upstream: Arc<str>,
    caller: Caller,
    tokens: Option<TokenGuard<SharedStore>>,
    all_fail_open: bool,
}

struct Compiled {
    matcher: crate::config::RouteMatch,
    label: Arc<str>,
    service: RouteService,
}

/// What one request came to, for `norepeat_gateway_requests_total`.
#[derive(Debug, Clone, Copy)]
struct Outcome(&'static str);

impl Gateway {
    /// Connects to the file's store and builds every route.
    ///
    /// # Errors
    /// The store cannot be reached, or the token secret cannot be read
    /// from it.
    pub async fn build(
        config: &Config,
        metrics: Option<PrometheusHandle>,
    ) -> Result<Self, StoreError> {
        let store = Resilient::new(AnyStore::from_url(config.store.as_url()).await?);
        let client = client();
        let routes = Routes::build(config, &store, &client, None).await?;
        Ok(Self {
            live: ArcSwap::from_pointee(routes),
            client,
            store,
            store_url: config.store.clone(),
            metrics,
        })
    }

    /// Replaces the routes, the upstream and the identity with `config`'s,
    /// atomically: a request in flight finishes on the routes it started
    /// on. The store and the listening address stay (they need a restart).
    /// Answers how many routes are served.
    ///
    /// # Errors
    /// The file names another store, or the token secret cannot be read;
    /// the old routes stay.
    pub async fn reload(&self, config: &Config) -> Result<usize, String> {
        if config.store != self.store_url {
            return Err("`store` changed: a new store needs a restart".to_owned());
        }
        let old = self.live.load();
        let routes = Routes::build(config, &self.store, &self.client, old.tokens.clone())
            .await
            .map_err(|e| format!("store: {e}"))?;
        let n = routes.list.len();
        self.live.store(Arc::new(routes));
        Ok(n)
    }

    /// The axum app: the own routes under `/.norepeat/`, every other
    /// request through the first route that matches, or straight through.
    pub fn into_router(self) -> axum::Router {
        own::router(Arc::new(self))
    }
}

impl Routes {
    async fn build(
        config: &Config,
        store: &SharedStore,
        client: &HttpClient,
        tokens: Option<TokenGuard<SharedStore>>,
    ) -> Result<Self, StoreError> {
        let caller = Caller::new(&config.identity);
        let wants_tokens = config
            .routes
            .iter()
            .any(|r| matches!(r.guard, Some(Guard::Token)));
        let tokens = match tokens {
            Some(t) if config.token_secret.is_none() => Some(t),
            _ if wants_tokens => {
                let secret = token_secret(config, store).await?;
                Some(TokenGuard::new(store.clone(), TokenSigner::new(secret)))
            }
            _ => None,
        };
        let list = config
            .routes
            .iter()
            .map(|r| Compiled {
                matcher: r.matcher.clone(),
                label: r.matcher.to_string().into(),
                service: stack(r, store, &caller, client, tokens.as_ref()),
            })
            .collect();
        Ok(Self {
            list,
            upstream: config.upstream.as_str().into(),
            caller,
            tokens,
            all_fail_open: config
                .routes
                .iter()
                .all(|r| r.on_store_failure == OnStoreFailure::Open),
        })
    }
}

/// The token secret: the file's (or the environment's), else the one kept
/// in the store, created by the first instance with one `SET NX`.
async fn token_secret(config: &Config, store: &SharedStore) -> Result<[u8; 32], StoreError> {
    if let Some(s) = &config.token_secret {
        return Ok(blake3::derive_key(
            "norepeat-gateway token secret v1",
            s.as_bytes(),
        ));
    }
    let mut fresh = [0u8; 32];
    getrandom::fill(&mut fresh).map_err(|e| StoreError::Protocol(format!("no randomness: {e}")))?;
    let hexed = hex::encode(fresh);
    // Keys always expire; ten years is "for as long as the store lives".
    let ttl = Duration::from_secs(10 * 365 * 24 * 3600);
    match store
        .put_if_absent(SECRET_KEY, hexed.as_bytes(), ttl)
        .await?
    {
        None => Ok(fresh),
        Some(held) => hex::decode(&held)
            .ok()
            .and_then(|v| <[u8; 32]>::try_from(v).ok())
            .ok_or_else(|| {
                StoreError::Protocol(format!("{SECRET_KEY} holds no 32-byte hex secret"))
            }),
    }
}

fn policy(p: OnStoreFailure) -> FailurePolicy {
    match p {
        OnStoreFailure::Open => FailurePolicy::FailOpen,
        OnStoreFailure::Closed => FailurePolicy::FailClosed,
    }
}

fn boxed<S, B>(service: S) -> RouteService
where
    S: tower::Service<Request<Body>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    BoxCloneSyncService::new(service.map_response(|r: Response<B>| r.map(Body::new)))
}

/// A route's stack: rate limit, guard, upstream.
fn stack(
    route: &Route,
    store: &SharedStore,
    caller: &Caller,
    client: &HttpClient,
    tokens: Option<&TokenGuard<SharedStore>>,
) -> RouteService {
    let label: Arc<str> = route.matcher.to_string().into();
    let keep = matches!(
        route.guard,
        Some(Guard::Idempotency {
            ambiguous: Ambiguous::Keep,
            ..
        })
    );
    let upstream = UpstreamStage {
        client: client.clone(),
        upstream: route.upstream.as_str().into(),
        timeout: route.timeout,
        label: Arc::clone(&label),
        keep,
    };
    let base = tower::service_fn(move |req: Request<Body>| {
        let u = upstream.clone();
        async move { Ok::<_, Infallible>(u.call(req).await) }
    });
    let on_failure = policy(route.on_store_failure);
    let name = label.to_string();
    let max_body = usize::try_from(route.max_request_body).unwrap_or(usize::MAX);
    let guarded = match &route.guard {
        None => boxed(base),
        Some(Guard::Token) => {
            let guard = tokens
                .expect("a token route has a token guard")
                .clone()
                .on_store_failure(on_failure);
            boxed(
                TokenLayer::new(guard)
                    .route(name.clone())
                    .identity(caller.clone())
                    .shadow(route.shadow)
                    .layer(base),
            )
        }
        Some(Guard::Fingerprint {
            window,
            ignore_fields,
        }) => {
            let fields = DEFAULT_IGNORED_FIELDS
                .iter()
                .map(|f| (*f).to_owned())
                .chain(ignore_fields.iter().cloned());
            let guard = FingerprintGuard::new(store.clone())
                .window(*window)
                .on_store_failure(on_failure)
                .fingerprinter(Fingerprinter::ignoring(fields));
            boxed(
                FingerprintLayer::new(guard)
                    .route(name.clone())
                    .identity(caller.clone())
                    .max_body(max_body)
                    .shadow(route.shadow)
                    .layer(base),
            )
        }
        Some(Guard::Idempotency {
            required,
            retention,
            ..
        }) => {
            let headers = DEFAULT_REPLAYED_HEADERS
                .iter()
                .cloned()
                .chain(std::iter::once(OUTCOME_HEADER));
            boxed(
                IdempotencyLayer::new(store.clone())
                    .required(*required)
                    .retention(*retention)
                    .max_body(usize::try_from(route.max_stored_response).unwrap_or(usize::MAX))
                    .max_request_body(max_body)
                    .on_store_failure(on_failure)
                    .identity(caller.clone())
                    .route(name.clone())
                    .header_allow_list(headers)
                    .shadow(route.shadow)
                    .layer(base),
            )
        }
    };
    let Some(rl) = route.rate_limit else {
        return guarded;
    };
    let limiter = RateLimiter::new(store.clone(), rl.quota)
        .algorithm(rl.algorithm)
        .on_store_failure(on_failure)
        .name(name.clone());
    let layer = match rl.by {
        LimitBy::Identity => RateLimitLayer::new(limiter, caller.clone()),
        LimitBy::Address => RateLimitLayer::new(limiter, caller.address()),
    };
    boxed(layer.route(name).shadow(route.shadow).layer(guarded))
}

/// The innermost stage of a route: the upstream, its timeout, its metric.
#[derive(Clone)]
struct UpstreamStage {
    client: HttpClient,
    upstream: Arc<str>,
    timeout: Duration,
    label: Arc<str>,
    keep: bool,
}

impl UpstreamStage {
    async fn call(self, req: Request<Body>) -> Response<Body> {
        let start = Instant::now();
        let result = forward(&self.client, &self.upstream, self.timeout, req).await;
        metrics::histogram!("norepeat_gateway_upstream_seconds", "route" => self.label.to_string())
            .record(start.elapsed().as_secs_f64());
        match result {
            Ok(mut res) => {
                // The backend cannot speak for the gateway.
                res.headers_mut().remove(OUTCOME_HEADER);
                res
            }
            Err(Failure::Unavailable) => upstream_unavailable(),
            Err(Failure::Timeout) if self.keep => {
                // Stored by the idempotency layer as the key's record.
                let mut res = Response::new(Body::empty());
                res.headers_mut()
                    .insert(OUTCOME_HEADER, HeaderValue::from_static("unknown"));
                res
            }
            Err(Failure::Timeout) => upstream_timeout(),
        }
    }
}

fn problem_response(p: &Problem, outcome: &'static str) -> Response<Body> {
    let mut res = p.to_response().map(Body::new);
    res.extensions_mut().insert(Outcome(outcome));
    res
}

fn upstream_unavailable() -> Response<Body> {
    let p = Problem::custom(
        StatusCode::BAD_GATEWAY,
        "upstream_unavailable",
        "Upstream unavailable",
    )
    .detail("The upstream refused the connection or could not be reached; nothing reached it.");
    problem_response(&p, "upstream_unavailable")
}

fn upstream_timeout() -> Response<Body> {
    let p = Problem::custom(StatusCode::GATEWAY_TIMEOUT, "upstream_timeout", "Upstream timeout")
        .detail("The upstream did not answer in time, or the connection broke after the request was sent: the outcome is unknown.");
    problem_response(&p, "upstream_timeout")
}

fn outcome_unknown() -> Response<Body> {
    let p = Problem::custom(StatusCode::CONFLICT, "idempotency_outcome_unknown", "Idempotency outcome unknown")
        .detail("An earlier request with this Idempotency-Key timed out upstream; its outcome is unknown, so it is not run again.");
    problem_response(&p, "outcome_unknown")
}

/// The `outcome` label of a layer's problem.
fn outcome_of(code: Code) -> &'static str {
    match code.as_str() {
        "duplicate_submission" | "missing_token" | "invalid_token" => "duplicate",
        "idempotency_key_in_use" => "in_progress",
        "idempotency_key_mismatch" => "mismatch",
        "rate_limited" => "rate_limited",
        "unauthenticated" => "unauthenticated",
        "guard_unavailable" => "unavailable",
        _ => "refused",
    }
}

/// Any request not for the gateway's own routes.
async fn dispatch(gw: Arc<Gateway>, req: Request<Body>) -> Response<Body> {
    let live = gw.live.load_full();
    let found = live
        .list
        .iter()
        .find(|r| r.matcher.matches(req.method().as_str(), req.uri().path()));
    let Some(route) = found else {
        return match forward(&gw.client, &live.upstream, PASSTHROUGH_TIMEOUT, req).await {
            Ok(res) => res,
            Err(Failure::Unavailable) => upstream_unavailable(),
            Err(Failure::Timeout) => upstream_timeout(),
        };
    };
    let res = match route.service.clone().oneshot(req).await {
        Ok(res) => res,
        Err(never) => match never {},
    };
    let (res, outcome) = finish(res);
    metrics::counter!("norepeat_gateway_requests_total", "route" => route.label.to_string(), "outcome" => outcome)
        .increment(1);
    res
}

/// Turns the upstream stage's "unknown" record into the client's answer,
/// and names the outcome.
fn finish(mut res: Response<Body>) -> (Response<Body>, &'static str) {
    let replayed = res.headers().contains_key(IDEMPOTENT_REPLAYED);
    if res.headers_mut().remove(OUTCOME_HEADER).is_some() {
        let res = if replayed {
            outcome_unknown()
        } else {
            upstream_timeout()
        };
        let outcome = if replayed {
            "outcome_unknown"
        } else {
            "upstream_timeout"
        };
        return (res, outcome);
    }
    if let Some(&Outcome(o)) = res.extensions().get::<Outcome>() {
        return (res, o);
    }
    if let Some(p) = res.extensions().get::<Problem>() {
        let o = outcome_of(p.code);
        return (res, o);
    }
    let o = if replayed { "replayed" } else { "passed" };
    (res, o)
}

/// Serves `gateway` on `listener` until `SIGTERM` (or Ctrl-C), then lets
/// requests in flight finish for at most 10 s. With `file`, the file is
/// read again when it changes (polled every 500 ms) and on `SIGHUP`: a
/// valid one replaces the routes ([`Gateway::reload`]), an invalid one is
/// logged and the old routes stay.
///
/// # Errors
/// The listener fails.
pub async fn serve(
    gateway: Gateway,
    listener: tokio::net::TcpListener,
    file: Option<PathBuf>,
) -> std::io::Result<()> {
    let gateway = Arc::new(gateway);
    let app = own::router(Arc::clone(&gateway));
    if let Some(path) = file {
        tokio::spawn(watch(gateway, path));
    }
    let (tx, mut rx) = tokio::sync::watch::channel(false);
    let server = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async move {
        stop_signal().await;
        let _ = tx.send(true);
    });
    let grace = async move {
        let _ = rx.wait_for(|stopped| *stopped).await;
        tokio::time::sleep(Duration::from_secs(10)).await;
    };
    tokio::select! {
        r = server.into_future() => r,
        () = grace => Ok(()),
    }
}

/// Reloads `path` when its modification time changes or on `SIGHUP`.
async fn watch(gw: Arc<Gateway>, path: PathBuf) {
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let mut seen = mtime(&path);
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        #[cfg(unix)]
        let hangup = async {
            match hup.as_mut() {
                Some(h) => {
                    h.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let hangup = std::future::pending::<()>();
        let by_signal = tokio::select! {
            () = hangup => true,
            () = tokio::time::sleep(Duration::from_millis(500)) => false,
        };
        let now = mtime(&path);
        if !by_signal && now == seen {
            continue;
        }
        seen = now;
        match Config::load(&path) {
            Ok(config) => match gw.reload(&config).await {
                Ok(n) => tracing::info!(file = %path.display(), routes = n, "reloaded"),
                Err(e) => {
                    tracing::error!(file = %path.display(), "not reloaded, the old routes stay: {e}");
                }
            },
            Err(problems) => {
                tracing::error!(file = %path.display(), "not reloaded, the old routes stay:\n{problems}");
            }
        }
    }
}

async fn stop_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = term.recv() => {},
            _ = ctrl_c => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
