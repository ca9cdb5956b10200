//! The gateway's own routes under `/.norepeat/`.

use super::gateway::{Gateway, dispatch};
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::routing::get;
use http::{Response, StatusCode, header};
use norepeat::identity::Identify;
use norepeat::problem::{Code, Problem};
use norepeat::store::{KeyValueStore, KeyValueStoreExt};
use std::sync::Arc;

pub(super) fn router(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/.norepeat/token", get(token).options(preflight))
        .route("/.norepeat/healthz", get(healthz))
        .route("/.norepeat/readyz", get(readyz))
        .route("/.norepeat/metrics", get(metrics))
        // After the routes: it applies to the routes there are.
        .method_not_allowed_fallback(|| async {
            Problem::custom(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request",
                "Method not allowed",
            )
            .detail("The gateway's own routes take GET; the Allow header says so.")
            .to_response()
            .map(Body::new)
        })
        .fallback(|State(gw): State<Arc<Gateway>>, req: Request| dispatch(gw, req))
        .with_state(gw)
}

/// The admin listener's routes (`admin.listen`): health, readiness and
/// metrics, apart from the traffic (a scraper or a probe that never
/// shares the public port). Anything else is 404.
pub(super) fn admin_router(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/.norepeat/healthz", get(healthz))
        .route("/.norepeat/readyz", get(readyz))
        .route("/.norepeat/metrics", get(metrics))
        .with_state(gw)
}

fn json(status: StatusCode, v: &serde_json::Value) -> Response<Body> {
    let mut res = Response::new(Body::from(v.to_string()));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    res
}

async fn token(State(gw): State<Arc<Gateway>>, req: Request) -> Response<Body> {
    let origin = req.headers().get(header::ORIGIN).cloned();
    let cors = Arc::clone(&gw.live.load().cors);
    let mut res = issue(&gw, req);
    super::cors::allow(&cors, origin.as_ref(), res.headers_mut());
    res
}

/// `OPTIONS /.norepeat/token`: a page's preflight (`cors`).
async fn preflight(State(gw): State<Arc<Gateway>>, req: Request) -> Response<Body> {
    let cors = Arc::clone(&gw.live.load().cors);
    super::cors::preflight(&cors, req.headers()).unwrap_or_else(|| {
        Problem::custom(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request",
            "Method not allowed",
        )
        .detail(
            "The gateway's own routes take GET; the Allow header says so (no cors in the file).",
        )
        .to_response()
        .map(Body::new)
    })
}

fn issue(gw: &Gateway, req: Request) -> Response<Body> {
    let live = gw.live.load();
    if live.tokens_pending {
        let p = Problem::new(Code::GuardUnavailable)
            .detail("The store that keeps the token secret does not answer yet; retry shortly.")
            .retry_after_secs(1);
        return p.to_response().map(Body::new);
    }
    let Some(tokens) = &live.tokens else {
        let p = Problem::custom(StatusCode::NOT_FOUND, "not_found", "Not found")
            .detail("No route of this gateway is guarded by tokens.");
        return p.to_response().map(Body::new);
    };
    let (mut parts, _) = req.into_parts();
    super::caller::with_peer(&mut parts.extensions);
    let Some(user) = live.caller.identify(&parts) else {
        let p = Problem::new(Code::Unauthenticated).detail(live.caller.missing());
        return p.to_response().map(Body::new);
    };
    let issued = tokens.issue(&user);
    let mut res = json(
        StatusCode::OK,
        &serde_json::json!({"repeatToken": issued.token, "expiresIn": issued.expires_in.as_secs()}),
    );
    res.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    res
}

/// Whether this process runs, and what it sees: the store (whether it
/// answers; the routes that refuse while it does not), the breaker, the
/// last reload. Always 200 while the process serves: the per-route state
/// is for an operator and the metrics, not for a load balancer.
async fn healthz(State(gw): State<Arc<Gateway>>) -> Response<Body> {
    let breaker = format!("{:?}", gw.store.circuit().state());
    let live = gw.live.load();
    // One conditional delete whose condition never holds: it writes
    // nothing (the store trait has no `PING`), through the same budget and
    // breaker as every guard.
    let answers = gw
        .store
        .delete_if_equals(PROBE_KEY, b"\0never written")
        .await
        .is_ok();
    let refusing: Vec<&str> = if answers {
        Vec::new()
    } else {
        live.list
            .iter()
            .filter(|r| r.fails_closed)
            .map(|r| r.metrics.label())
            .collect()
    };
    let reload = match &*gw.last_reload.lock().unwrap_or_else(|p| p.into_inner()) {
        None => serde_json::Value::Null,
        Some(Ok(routes)) => serde_json::json!({"result": "applied", "routes": routes}),
        Some(Err(e)) => serde_json::json!({"result": "failed", "error": e}),
    };
    json(
        StatusCode::OK,
        &serde_json::json!({
            "status": "ok",
            "routes": live.list.len(),
            "store": gw.store.kind(),
            "breaker": breaker,
            "store_answers": answers,
            "refusing": refusing,
            "last_reload": reload,
        }),
    )
}

/// The key the health probe asks about. Nothing writes it: the probe
/// is a conditional delete whose condition cannot hold, so it changes
/// nothing and creates no key.
const PROBE_KEY: &str = "norepeat:gateway:readyz";

/// Whether this process can serve: 200, or 503 once it drains
/// (`SIGTERM`). A store that is down does not make an instance unready:
/// every instance shares it, so taking them all out of the load balancer
/// helps nobody; its routes follow their failure policy, and `healthz`
/// and the metrics show it.
async fn readyz(State(gw): State<Arc<Gateway>>) -> Response<Body> {
    if gw.draining.is_cancelled() {
        json(
            StatusCode::SERVICE_UNAVAILABLE,
            &serde_json::json!({"status": "draining"}),
        )
    } else {
        json(StatusCode::OK, &serde_json::json!({"status": "ready"}))
    }
}

async fn metrics(State(gw): State<Arc<Gateway>>) -> Response<Body> {
    let text = gw.metrics.as_ref().map(|m| m.render()).unwrap_or_default();
    let mut res = Response::new(Body::from(text));
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    res
}
