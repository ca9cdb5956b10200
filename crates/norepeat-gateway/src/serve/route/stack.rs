// Over 400 lines on purpose: a route's whole stack (its layers, the replay wrapper, the upstream stage), read top to bottom in one place.
//! A route as a tower stack: rate limit, guard, upstream stage; the
//! gateway's own problems.

use crate::config::{Ambiguous, Guard, LimitBy, OnStoreFailure, Route};
use crate::serve::answers::{
    client_body_broke, payload_too_large, upstream_timeout, upstream_unavailable,
};
use crate::serve::identify::scope::HostScoped;
use crate::serve::log::metrics::RouteMetrics;
use crate::serve::store::SharedStore;
use crate::serve::upstream::lookup::Lookups;
use crate::serve::upstream::pool::{Pool, client, connect_timeout};
use crate::serve::upstream::{Broken, Failure, forward, read_ahead};
use axum::body::Body;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::BodyExt;
use norepeat::body::declares_over;
use norepeat::degrade::{FailedOpen, FailurePolicy};
use norepeat::fingerprint::{FingerprintGuard, FingerprintLayer, Fingerprinter};
use norepeat::idempotency::{
    Abandoned, Attempt, DetachedTasks, IdempotencyLayer, OutcomeUnknown, StoredHeaders,
};
use norepeat::problem::{Code, Problem};
use norepeat::ratelimit::{RateLimitLayer, RateLimiter};
use norepeat::token::{TokenGuard, TokenLayer};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt};

fn policy(p: OnStoreFailure) -> FailurePolicy {
    match p {
        OnStoreFailure::Open => FailurePolicy::FailOpen,
        OnStoreFailure::Closed => FailurePolicy::FailClosed,
    }
}

/// A route's whole stack.
pub(crate) type RouteService = BoxCloneSyncService<Request<Body>, Response<Body>, Infallible>;

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

/// A route's stack: rate limit, guard, upstream. `detached` tracks the
/// upstream calls of clients that left; `stopping` ends every call still
/// waiting when a shutdown's grace is over. With it, an idempotency
/// route's layer, whose records the admin routes read and clear.
pub(crate) fn stack(
    route: &Route,
    store: &SharedStore,
    scoped: &HostScoped,
    (detached, stopping): (&DetachedTasks, &CancellationToken),
    tokens: Option<&TokenGuard<SharedStore>>,
    token_ttl: Duration,
    metrics: &Arc<RouteMetrics>,
) -> (RouteService, Option<IdempotencyLayer<SharedStore>>) {
    let caller = scoped.caller();
    let mut records = None;
    let keep = route
        .guard
        .as_ref()
        .is_some_and(Guard::keeps_unknown_outcomes);
    let keeps_answers = route.guard.as_ref().is_some_and(Guard::keeps_answers);
    let upstream = UpstreamStage {
        client: client(connect_timeout(route.timeout), &route.upstream),
        timeout: route.timeout,
        metrics: Arc::clone(metrics),
        keep,
        idempotency: keeps_answers,
        stopping: stopping.clone(),
        read_ahead: keeps_answers
            .then(|| usize::try_from(route.max_stored_response).unwrap_or(usize::MAX)),
        // A layer that reads the body does so under this cap itself; the
        // others stream it, capped here.
        body_cap: (!route.guard.as_ref().is_some_and(Guard::reads_body))
            .then(|| usize::try_from(route.max_request_body).unwrap_or(usize::MAX)),
    };
    let base = tower::service_fn(move |req: Request<Body>| {
        let u = upstream.clone();
        // Boxed: the forwarding future (hyper's client, the timers) would
        // otherwise be moved whole through every layer above it.
        async move { Ok::<_, Infallible>(Box::pin(u.call(req)).await) }
    });
    let on_failure = policy(route.on_store_failure);
    let name = metrics.label().to_owned();
    let max_body = usize::try_from(route.max_request_body).unwrap_or(usize::MAX);
    let guarded = match &route.guard {
        None => boxed(base),
        Some(Guard::Token) if tokens.is_none() => {
            // The secret is not read yet (the store was down): the route's
            // failure policy, as for any store failure.
            let open = on_failure == FailurePolicy::FailOpen || route.shadow;
            boxed(tower::service_fn(move |req: Request<Body>| {
                let base = base.clone();
                async move {
                    if open {
                        let mut res = base.oneshot(req).await?;
                        res.extensions_mut().insert(FailedOpen(vec!["token"]));
                        return Ok(res);
                    }
                    let p = Problem::new(Code::GuardUnavailable)
                        .detail("The store that keeps the token secret does not answer yet; retry shortly.")
                        .retry_after_secs(1);
                    Ok(p.to_response().map(Body::new))
                }
            }))
        }
        Some(Guard::Token) => {
            let guard = tokens
                .expect("a token route has a token guard")
                .clone()
                .on_store_failure(on_failure);
            boxed(
                TokenLayer::new(guard)
                    .route(name.clone())
                    .identity(caller.clone())
                    // A plain HTML form sends its token as a field.
                    .form_field(max_body)
                    .shadow(route.shadow)
                    .layer(base),
            )
        }
        Some(Guard::Fingerprint {
            window,
            ignore_fields,
        }) => {
            let guard = FingerprintGuard::new(store.clone())
                .window(*window)
                .on_store_failure(on_failure)
                .fingerprinter(Fingerprinter::ignoring(ignore_fields.iter().cloned()));
            boxed(
                FingerprintLayer::new(guard)
                    .route(name.clone())
                    .identity(scoped.clone())
                    .max_body(max_body)
                    .shadow(route.shadow)
                    .layer(base),
            )
        }
        Some(Guard::Idempotency {
            required,
            retention,
            ambiguous,
            reconcile,
        }) => {
            // `keep`: a claim whose gateway died mid-request is an unknown
            // outcome, like a timeout; `release`: a retry takes it over, and
            // the backend is told the attempt.
            let abandoned = match ambiguous {
                Ambiguous::Keep => Abandoned::OutcomeUnknown,
                Ambiguous::Release => Abandoned::Retry,
            };
            let layer = IdempotencyLayer::new(store.clone())
                .required(*required)
                .retention(*retention)
                .abandoned(abandoned)
                .max_body(usize::try_from(route.max_stored_response).unwrap_or(usize::MAX))
                .max_request_body(max_body)
                .on_store_failure(on_failure)
                .identity(scoped.clone())
                .route(name.clone())
                // The first answer's headers, but hop-by-hop and
                // Set-Cookie.
                .stored_headers(StoredHeaders::AllButHopByHop)
                .detached_tasks_in(detached)
                .shadow(route.shadow);
            let layer = match reconcile {
                Some(lookup) => layer.reconcile(Lookups {
                    client: client(connect_timeout(route.timeout), &route.upstream),
                    lookup: lookup.clone(),
                    timeout: route.timeout,
                    max_body: usize::try_from(route.max_stored_response).unwrap_or(usize::MAX),
                    route: Arc::from(name.as_str()),
                }),
                None => layer,
            };
            records = Some(layer.clone());
            boxed(layer.layer(base))
        }
    };
    // `on_repeat: replay`: the first answer kept under the token (for its
    // life) or the fingerprint (for the window), replayed to a repeat.
    let guarded = match (route.on_repeat, &route.guard) {
        (Some(wait), Some(Guard::Token)) => {
            let layer = replaying(route, store, &name, (wait, token_ttl))
                .identity(caller.clone())
                .key_from(|head, body| norepeat::token::presented(head, body));
            boxed(
                layer
                    .layer(guarded)
                    .map_response(|r| in_use_is_duplicate(r.map(Body::new))),
            )
        }
        (
            Some(wait),
            Some(Guard::Fingerprint {
                window,
                ignore_fields,
            }),
        ) => {
            let same = Fingerprinter::ignoring(ignore_fields.iter().cloned());
            let keyed = same.clone();
            let layer = replaying(route, store, &name, (wait, *window))
                .identity(scoped.clone())
                .fingerprinter(same)
                .key_from(move |head, body| {
                    let fp = keyed
                        .fingerprint_http("", head, head.uri.path(), body)
                        .ok()?;
                    Some(hex::encode(&fp.0[..16]))
                });
            boxed(
                layer
                    .layer(guarded)
                    .map_response(|r| in_use_is_duplicate(r.map(Body::new))),
            )
        }
        _ => guarded,
    };
    let Some(rl) = route.rate_limit else {
        return (guarded, records);
    };
    let limiter = RateLimiter::new(store.clone(), rl.quota)
        .algorithm(rl.algorithm)
        .on_store_failure(on_failure)
        .name(name.clone());
    let layer = match rl.by {
        LimitBy::Identity => RateLimitLayer::new(limiter, caller.clone()),
        LimitBy::Address => RateLimitLayer::new(limiter, caller.address()),
    };
    (
        boxed(layer.route(name).shadow(route.shadow).layer(guarded)),
        records,
    )
}

/// The layer that keeps a token or fingerprint route's first answer for
/// `life` and replays it to a repeat (`on_repeat: replay`), a repeat that
/// comes while the first is at the backend waiting up to `wait`. No key of
/// the request's own (no token): it goes on to the guard, which answers.
fn replaying(
    route: &Route,
    store: &SharedStore,
    name: &str,
    (wait, life): (Duration, Duration),
) -> IdempotencyLayer<SharedStore> {
    IdempotencyLayer::new(store.clone())
        .required(false)
        .retention(life)
        .wait_for_result(wait)
        .max_body(usize::try_from(route.max_stored_response).unwrap_or(usize::MAX))
        .max_request_body(usize::try_from(route.max_request_body).unwrap_or(usize::MAX))
        .on_store_failure(policy(route.on_store_failure))
        .route(name.to_owned())
        .stored_headers(StoredHeaders::AllButHopByHop)
        .shadow(route.shadow)
}

/// A repeat still waiting when its `wait` ran out is refused as `refuse`
/// refuses it: 409 `duplicate_submission`.
fn in_use_is_duplicate(res: Response<Body>) -> Response<Body> {
    let in_use = res
        .extensions()
        .get::<Problem>()
        .is_some_and(|p| p.code == Code::IdempotencyKeyInUse);
    if !in_use {
        return res;
    }
    let p = Problem::new(Code::DuplicateSubmission)
        .detail("The same submission is still being processed; retry shortly to get its answer.")
        .retry_after_secs(1);
    p.to_response().map(Body::new)
}

/// The innermost stage of a route: the upstream, its timeout, its metric.
#[derive(Clone)]
struct UpstreamStage {
    client: Pool,
    timeout: Duration,
    metrics: Arc<RouteMetrics>,
    /// `ambiguous: keep`: an unknown outcome is recorded.
    keep: bool,
    /// An idempotency route: the backend is told the attempt
    /// (`Idempotency-Attempt`).
    idempotency: bool,
    /// On an idempotency route, `max_stored_response`: the answer's body
    /// is read that far before the layer gets it, so that one that breaks
    /// is an unknown outcome (504), not a status recorded without its body.
    read_ahead: Option<usize>,
    /// Cancelled at the end of a shutdown's grace.
    stopping: CancellationToken,
    /// On a route whose body is streamed (token, rate limit only),
    /// `max_request_body`: a body declared larger is refused before it is
    /// sent (413), one that grows larger while it streams is cut off there
    /// and answered 413 too.
    body_cap: Option<usize>,
}

/// The request header that tells the backend which attempt at its
/// `Idempotency-Key` a request is: 1, then 2 after a take-over of an
/// abandoned claim (`ambiguous: release`), and so on.
pub(crate) const IDEMPOTENCY_ATTEMPT: http::HeaderName =
    http::HeaderName::from_static("idempotency-attempt");

/// The backend's own statuses that leave the outcome unknown on a route
/// with `ambiguous: keep`: an error inside the backend (500) or behind it
/// (504), after which it may or may not have had its effect. 502 and 503
/// say the request was not handled, and free the key.
fn unknown_outcome(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::INTERNAL_SERVER_ERROR | StatusCode::GATEWAY_TIMEOUT
    )
}

impl UpstreamStage {
    async fn call(self, mut req: Request<Body>) -> Response<Body> {
        let told = req
            .extensions()
            .get::<Arc<crate::serve::log::access::UpstreamTime>>()
            .cloned();
        // The attempt is the gateway's to say; never the client's.
        let attempt = req.extensions().get::<Attempt>().copied();
        let headers = req.headers_mut();
        headers.remove(IDEMPOTENCY_ATTEMPT);
        if let (true, Some(a)) = (self.idempotency, attempt) {
            headers.insert(IDEMPOTENCY_ATTEMPT, HeaderValue::from(u16::from(a.get())));
        }
        let (req, over) = match self.body_cap {
            Some(max) if declares_over(req.headers(), max) => return payload_too_large(max),
            Some(max) => {
                let (req, over) = cap_body(req, max);
                (req, Some(over))
            }
            None => (req, None),
        };
        let start = Instant::now();
        let idle = Some(self.timeout);
        let call = async {
            let result = forward(self.client.get(), self.timeout, idle, req).await;
            match (result, self.read_ahead) {
                (Ok(res), Some(cap)) => {
                    let (head, body) = res.into_parts();
                    read_ahead(body, cap)
                        .await
                        .map(|body| Response::from_parts(head, body))
                        .map_err(|Broken| Failure::Timeout)
                }
                (result, _) => result,
            }
        };
        // A call still waiting when a shutdown's grace is over ends as a
        // timeout does: its request may have reached the backend, so on
        // `ambiguous: keep` its key records the unknown outcome before the
        // process exits, and a retry after the restart is answered 409,
        // never run again (dropped with the process, the claim would end
        // with its lease and the retry would run).
        let result = tokio::select! {
            result = call => result,
            () = self.stopping.cancelled() => Err(Failure::Timeout),
        };
        let took = start.elapsed();
        self.metrics.upstream(took.as_secs_f64());
        crate::serve::log::access::UpstreamTime::note(told.as_ref(), took);
        if result.is_err() && over.is_some_and(|o| o.load(Ordering::SeqCst)) {
            return payload_too_large(self.body_cap.unwrap_or_default());
        }
        match result {
            Ok(mut res) => {
                crate::serve::log::access::UpstreamTime::note_status(
                    told.as_ref(),
                    res.status().as_u16(),
                );
                if self.keep && unknown_outcome(res.status()) {
                    // Recorded by the idempotency layer as the key's unknown
                    // outcome; the client gets the backend's answer as it
                    // is, and a retry 409 `idempotency_outcome_unknown`.
                    res.extensions_mut().insert(OutcomeUnknown);
                }
                res
            }
            Err(Failure::Unavailable) => upstream_unavailable(),
            Err(Failure::ClientBody) => client_body_broke(),
            // A 101 nobody asked for came after the request reached the
            // backend: its outcome is unknown, as a timeout's.
            Err(Failure::Timeout | Failure::Switched) if self.keep => {
                let mut res = upstream_timeout();
                res.extensions_mut().insert(OutcomeUnknown);
                res
            }
            Err(Failure::Timeout | Failure::Switched) => upstream_timeout(),
        }
    }
}

/// `req` with its body capped at `max` bytes, and the flag set when the
/// cap cuts it off.
fn cap_body(req: Request<Body>, max: usize) -> (Request<Body>, Arc<AtomicBool>) {
    let over = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&over);
    let req = req.map(|body| {
        Body::new(http_body_util::Limited::new(body, max).map_err(move |e| {
            if e.is::<http_body_util::LengthLimitError>() {
                flag.store(true, Ordering::SeqCst);
            }
            e
        }))
    });
    (req, over)
}
