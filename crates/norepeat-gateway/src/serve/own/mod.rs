//! The gateway's own routes under `/.norepeat/`: the token, health,
//! readiness and metrics on the traffic's listener, and the admin
//! listener's (the same, and one key's record).

mod records;

use crate::serve::gateway::Gateway;
use crate::serve::proxy::{dispatch, leave_if_draining};
use crate::serve::route::table::Routes;
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::routing::get;
use http::{Response, StatusCode, header};
use norepeat::identity::Identify;
use norepeat::problem::{Code, Problem};
use norepeat::store::KeyValueStore;
use records::record;
use std::sync::Arc;

impl Gateway {
    /// The axum app: the own routes under `/.norepeat/`, every other
    /// request through the first route that matches, or straight through.
    pub fn into_router(self) -> axum::Router {
        router(Arc::new(self))
    }
}

/// What the traffic's listener serves: the gateway's own routes (every
/// path under `/.norepeat/`) through [`router`], every other request
/// straight to [`dispatch`], the router's fallback, without the router's
/// matching and extractors on the way (7 % of a pass-through request's
/// instructions; BENCHMARKS.md, issue 39).
///
/// The admin listener's front ([`Front::admin`]) serves the admin router
/// alone, on the same connections and limits as the traffic's (a listener
/// without them let idle connections use up the process's descriptors).
#[derive(Clone)]
pub(crate) struct Front {
    own: Router,
    gw: Arc<Gateway>,
    admin: bool,
}

/// The prefix of the gateway's own routes.
const OWN: &str = "/.norepeat/";

impl Front {
    pub(crate) fn new(gw: Arc<Gateway>) -> Self {
        Self {
            own: router(Arc::clone(&gw)),
            gw,
            admin: false,
        }
    }

    /// The admin listener's: [`admin_router`] for every request.
    pub(crate) fn admin(gw: Arc<Gateway>) -> Self {
        Self {
            own: admin_router(Arc::clone(&gw)),
            gw,
            admin: true,
        }
    }

    /// Whether this is the admin listener's front (no pass-through lane).
    pub(crate) fn is_admin(&self) -> bool {
        self.admin
    }

    /// The gateway this front serves.
    pub(crate) fn gateway(&self) -> &Arc<Gateway> {
        &self.gw
    }

    /// `req`'s answer. Any prefix spelled otherwise (`/.norepeat%2F`,
    /// `//.norepeat/`) is no own route for the router either: it goes to
    /// `dispatch` both ways.
    pub(crate) async fn call(self, req: Request) -> Response<Body> {
        if self.admin || req.uri().path().starts_with(OWN) {
            let http1 = req.version() < http::Version::HTTP_2;
            let mut res = match tower::ServiceExt::oneshot(self.own, req).await {
                Ok(res) => res,
                Err(never) => match never {},
            };
            leave_if_draining(&self.gw, http1, &mut res);
            res
        } else {
            dispatch(self.gw, req, None).await
        }
    }
}

/// The traffic listener's own routes. With an admin listener, health,
/// readiness and metrics are served there only (a scraper or a probe that
/// never shares the public port, and nothing of the process shown to its
/// clients), but for those the file's `admin.public` lists; the token route
/// is always here.
pub(crate) fn router(gw: Arc<Gateway>) -> Router {
    let public = gw.applied.load().admin.as_ref().map(|a| a.public.clone());
    let served = |name: &str| public.as_ref().is_none_or(|p| p.iter().any(|n| n == name));
    let hidden = || async {
        Problem::custom(StatusCode::NOT_FOUND, "not_found", "Not found")
            .detail("Served on the admin listener only (admin.public lists those served here too).")
            .to_response()
            .map(Body::new)
    };
    let mut r = Router::new().route("/.norepeat/token", get(token).options(preflight));
    r = if served("healthz") {
        r.route("/.norepeat/healthz", get(healthz))
    } else {
        r.route("/.norepeat/healthz", get(hidden))
    };
    r = if served("readyz") {
        r.route("/.norepeat/readyz", get(readyz))
    } else {
        r.route("/.norepeat/readyz", get(hidden))
    };
    r = if served("metrics") {
        r.route("/.norepeat/metrics", get(metrics))
    } else {
        r.route("/.norepeat/metrics", get(hidden))
    };
    r
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
        .fallback(|State(gw): State<Arc<Gateway>>, req: Request| dispatch(gw, req, None))
        .with_state(gw)
}

/// The admin listener's routes (`admin.listen`): health, readiness and
/// metrics, apart from the traffic (a scraper or a probe that never
/// shares the public port). Anything else is 404.
pub(crate) fn admin_router(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/.norepeat/healthz", get(admin_healthz))
        .route("/.norepeat/readyz", get(readyz))
        .route("/.norepeat/metrics", get(metrics))
        .route("/.norepeat/admin/record", get(record).delete(record))
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
    // One load: the CORS list and the signer of one configuration, even
    // across a reload.
    let live = gw.live.load_full();
    // A caller the backend names is asked first (`introspect`).
    let mut req = req;
    crate::serve::identify::caller::with_peer(req.extensions_mut());
    let asked = match live.tokens {
        Some(_) => crate::serve::identify::identify(&live.caller, req).await,
        None => Ok(req),
    };
    let mut res = asked.map_or_else(|refused| refused, |req| issue(&live, req));
    crate::serve::cors::allow(&live.cors, origin.as_ref(), res.headers_mut());
    res
}

/// `OPTIONS /.norepeat/token`: a page's preflight (`cors`).
async fn preflight(State(gw): State<Arc<Gateway>>, req: Request) -> Response<Body> {
    let cors = Arc::clone(&gw.live.load().cors);
    crate::serve::cors::preflight(&cors, req.headers()).unwrap_or_else(|| {
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

fn issue(live: &Routes, req: Request) -> Response<Body> {
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
    crate::serve::identify::caller::with_peer(&mut parts.extensions);
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
    health(&gw, false)
}

/// The admin listener's `healthz`: the public one's, and why the last
/// reload failed (its text may name files: not for the public port).
async fn admin_healthz(State(gw): State<Arc<Gateway>>) -> Response<Body> {
    health(&gw, true)
}

/// What the process knows of itself, from the state it keeps: no store
/// command per call (a flood of probes on the public port once sent two
/// each, and opened the store's breaker). Whether the store answers is
/// the last background probe's ([`probe_store`]).
fn health(gw: &Gateway, detailed: bool) -> Response<Body> {
    let breaker = format!("{:?}", gw.store.circuit().state());
    let live = gw.live.load();
    let answers = gw.store_answers.load(std::sync::atomic::Ordering::Acquire);
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
        Some(Err(e)) if detailed => serde_json::json!({"result": "failed", "error": e}),
        Some(Err(_)) => serde_json::json!({"result": "failed"}),
    };
    json(
        StatusCode::OK,
        &serde_json::json!({
            "status": "ok",
            "routes": live.list.len(),
            "store": gw.store.kind(),
            "records": gw.records.as_ref().map(crate::serve::store::SharedStore::kind),
            "store_persistent": match gw.store_persistent.load(std::sync::atomic::Ordering::Acquire) {
                crate::serve::gateway::PERSISTENT => true.into(),
                crate::serve::gateway::FORGETS => false.into(),
                _ => serde_json::Value::Null,
            },
            "store_lost_data_at": match gw.store_lost_data_at.load(std::sync::atomic::Ordering::Acquire) {
                0 => serde_json::Value::Null,
                ms => ms.into(),
            },
            "breaker": breaker,
            "store_answers": answers,
            "refusing": refusing,
            "last_reload": reload,
        }),
    )
}

/// Whether this process can serve: 200, or 503 once it drains
/// (`SIGTERM`). A store that is down does not make an instance unready:
/// every instance shares it, so taking them all out of the load balancer
/// helps nobody; its routes follow their failure policy, and `healthz`
/// and the metrics show it.
async fn readyz(State(gw): State<Arc<Gateway>>) -> Response<Body> {
    if gw.draining.started() {
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
