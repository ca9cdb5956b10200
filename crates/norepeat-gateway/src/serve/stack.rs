//! A route as a tower stack: rate limit, guard, upstream stage; the
//! gateway's own problems.

use super::Caller;
use super::forward::{Failure, HttpClient, client, connect_timeout, forward};
use super::gateway::{OUTCOME_HEADER, Outcome, RouteService, SharedStore};
use crate::config::{Ambiguous, Guard, LimitBy, OnStoreFailure, Route};

use axum::body::Body;
use http::{HeaderValue, Request, Response, StatusCode};

use norepeat::degrade::FailurePolicy;
use norepeat::fingerprint::{
    DEFAULT_IGNORED_FIELDS, FingerprintGuard, FingerprintLayer, Fingerprinter,
};
use norepeat::idempotency::{DEFAULT_REPLAYED_HEADERS, DetachedTasks, IdempotencyLayer};
use norepeat::problem::{Code, Problem};
use norepeat::ratelimit::{RateLimitLayer, RateLimiter};
use norepeat::token::{TokenGuard, TokenLayer};
use std::convert::Infallible;

use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt};

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
pub(super) fn stack(
    route: &Route,
    store: &SharedStore,
    caller: &Caller,
    detached: &DetachedTasks,
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
        client: client(connect_timeout(route.timeout)),
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
                    .detached_tasks_in(detached)
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
        let idle = Some(self.timeout);
        let result = forward(&self.client, &self.upstream, self.timeout, idle, req).await;
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

pub(super) fn upstream_unavailable() -> Response<Body> {
    let p = Problem::custom(
        StatusCode::BAD_GATEWAY,
        "upstream_unavailable",
        "Upstream unavailable",
    )
    .detail("The upstream refused the connection or could not be reached; nothing reached it.");
    problem_response(&p, "upstream_unavailable")
}

pub(super) fn upstream_timeout() -> Response<Body> {
    let p = Problem::custom(StatusCode::GATEWAY_TIMEOUT, "upstream_timeout", "Upstream timeout")
        .detail("The upstream did not answer in time, or the connection broke after the request was sent: the outcome is unknown.");
    problem_response(&p, "upstream_timeout")
}

pub(super) fn outcome_unknown() -> Response<Body> {
    let p = Problem::custom(StatusCode::CONFLICT, "idempotency_outcome_unknown", "Idempotency outcome unknown")
        .detail("An earlier request with this Idempotency-Key timed out upstream; its outcome is unknown, so it is not run again.");
    problem_response(&p, "outcome_unknown")
}

/// The `outcome` label of a layer's problem.
pub(super) fn outcome_of(code: Code) -> &'static str {
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
