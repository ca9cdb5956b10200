//! The gateway's own routes under `/.norepeat/`: the token, health,
//! readiness and metrics on the traffic's listener, and the admin
//! listener's (the same, and one key's record).

use super::HostScoped;
use super::OUTCOME_HEADER;
use super::gateway::{Gateway, Routes};
use super::request::dispatch;
use crate::config::{normalize_host, normalize_path, route_spelling};
use axum::Router;
use axum::body::Body;
use axum::extract::Query;
use axum::extract::{Request, State};
use axum::routing::get;
use http::{Response, StatusCode, header};
use norepeat::idempotency::RecordState;
use norepeat::identity::Identify;
use norepeat::problem::{Code, Problem};
use norepeat::store::{KeyValueStore, KeyValueStoreExt};
use std::collections::HashMap;
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
pub(super) struct Front {
    own: Router,
    gw: Arc<Gateway>,
    admin: bool,
}

/// The prefix of the gateway's own routes.
const OWN: &str = "/.norepeat/";

impl Front {
    pub(super) fn new(gw: Arc<Gateway>) -> Self {
        Self {
            own: router(Arc::clone(&gw)),
            gw,
            admin: false,
        }
    }

    /// The admin listener's: [`admin_router`] for every request.
    pub(super) fn admin(gw: Arc<Gateway>) -> Self {
        Self {
            own: admin_router(Arc::clone(&gw)),
            gw,
            admin: true,
        }
    }

    /// Whether this is the admin listener's front (no pass-through lane).
    pub(super) fn is_admin(&self) -> bool {
        self.admin
    }

    /// The gateway this front serves.
    pub(super) fn gateway(&self) -> &Arc<Gateway> {
        &self.gw
    }

    /// `req`'s answer. Any prefix spelled otherwise (`/.norepeat%2F`,
    /// `//.norepeat/`) is no own route for the router either: it goes to
    /// `dispatch` both ways.
    pub(super) async fn call(self, req: Request) -> Response<Body> {
        if self.admin || req.uri().path().starts_with(OWN) {
            // While draining, an HTTP/1 client is told to leave its
            // connection, as `dispatch` tells the traffic's.
            let leave = self.gw.draining.started() && req.version() < http::Version::HTTP_2;
            let mut res = match tower::ServiceExt::oneshot(self.own, req).await {
                Ok(res) => res,
                Err(never) => match never {},
            };
            if leave {
                res.headers_mut()
                    .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
            }
            res
        } else {
            dispatch(self.gw, req).await
        }
    }
}

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
        .route("/.norepeat/healthz", get(admin_healthz))
        .route("/.norepeat/readyz", get(readyz))
        .route("/.norepeat/metrics", get(metrics))
        .route("/.norepeat/admin/record", get(record).delete(record))
        .with_state(gw)
}

/// The header that carries the admin token (not `Authorization`, which may
/// be the identity the record is scoped by).
const ADMIN_TOKEN: &str = "norepeat-admin-token";

/// `GET` or `DELETE /.norepeat/admin/record?method=POST&path=/payments&key=K[&host=H]`
/// with the admin token, and the headers that name the caller as the
/// client sent them (`X-User-Id: 42`, ...): that key's record on the
/// idempotency route taking `method path`, read, or cleared when it still
/// holds what was read (the key then runs again: for an operator who has
/// checked what the backend did with an `idempotency_outcome_unknown`).
async fn record(
    State(gw): State<Arc<Gateway>>,
    Query(params): Query<HashMap<String, String>>,
    req: Request,
) -> Response<Body> {
    let problem = |status: StatusCode, code: &'static str, detail: String| {
        let title = status.canonical_reason().unwrap_or("Error");
        Problem::custom(status, code, title)
            .detail(detail)
            .to_response()
            .map(Body::new)
    };
    let Some(want) = gw.admin_token else {
        return problem(
            StatusCode::NOT_FOUND,
            "not_found",
            "The record routes are served only with admin.token_env set.".into(),
        );
    };
    let given = req
        .headers()
        .get(ADMIN_TOKEN)
        .map(|v| blake3::hash(v.as_bytes()));
    if given.is_none_or(|g| g != want) {
        return problem(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            format!("The record routes need the admin token in {ADMIN_TOKEN}."),
        );
    }
    let (Some(method), Some(path), Some(key), Some(host)) = (
        params.get("method"),
        params.get("path"),
        params.get("key"),
        params.get("host"),
    ) else {
        return problem(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "Give method, path, key and host (the Host the client sent: records are scoped by it): ?method=POST&path=/payments&key=K&host=shop.example".into(),
        );
    };
    let Ok(method) = http::Method::from_bytes(method.as_bytes()) else {
        return problem(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("{method:?} is no method."),
        );
    };
    let path = normalize_path(path);
    let live = gw.live.load();
    let site = normalize_host(host);
    let Some((layer, route_caller)) = live
        .list
        .iter()
        .find(|r| {
            r.matcher.matches(method.as_str(), &path)
                && r.host.as_ref().is_none_or(|h| site.as_ref() == Some(h))
        })
        .and_then(|r| Some((r.records.as_ref()?, &r.caller)))
    else {
        return problem(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("No idempotency route takes {method} {path}."),
        );
    };
    // The caller as the client's request named it: its headers, on the
    // site it called.
    let (mut parts, ()) = http::Request::builder()
        .method(method.clone())
        .uri(path.as_ref())
        .body(())
        .map(http::Request::into_parts)
        .unwrap_or_else(|_| http::Request::new(()).into_parts());
    parts.headers = req.headers().clone();
    parts.headers.remove(ADMIN_TOKEN);
    parts.headers.remove(header::HOST);
    if let Ok(h) = header::HeaderValue::from_str(host) {
        parts.headers.insert(header::HOST, h);
    }
    let Some(caller) = HostScoped::new(route_caller.clone())
        .site(live.site.clone())
        .identify(&parts)
    else {
        return problem(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!(
                "No caller: send the headers the client sent. {}",
                route_caller.missing()
            ),
        );
    };
    let spelled = route_spelling(&path);
    let read = match layer.inspect(&caller, &method, &spelled, key).await {
        Ok(Some(r)) => r,
        Ok(None) => return json(StatusCode::NOT_FOUND, &serde_json::json!({"state": "none"})),
        Err(e) => {
            return problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "guard_unavailable",
                format!("The store: {e}"),
            );
        }
    };
    let mut shown = match &read.state {
        RecordState::InProgress { attempt } => {
            serde_json::json!({"state": "in_progress", "attempt": attempt})
        }
        RecordState::Abandoned { attempt } => {
            serde_json::json!({"state": "abandoned", "attempt": attempt})
        }
        RecordState::Released { attempt } => {
            serde_json::json!({"state": "released", "attempt": attempt})
        }
        RecordState::Completed {
            status,
            headers,
            body_len,
        } => {
            // The gateway's own record of an unknown outcome (see the
            // module docs): a 200 carrying OUTCOME_HEADER.
            let unknown = headers.iter().any(|h| h == OUTCOME_HEADER.as_str());
            serde_json::json!({
                "state": if unknown { "outcome_unknown" } else { "completed" },
                "status": status.as_u16(),
                "headers": headers,
                "body_len": body_len,
            })
        }
        _ => serde_json::json!({"state": "unknown"}),
    };
    if req.method() != http::Method::DELETE {
        return json(StatusCode::OK, &shown);
    }
    if matches!(read.state, RecordState::InProgress { .. }) {
        // Its request still runs (its lease is renewed): cleared, a retry
        // would run the effect beside it, and its own answer would be lost.
        return problem(
            StatusCode::CONFLICT,
            "record_in_progress",
            "The key's request is still running (its lease is renewed); a record is cleared once it is completed, abandoned or an unknown outcome.".into(),
        );
    }
    match layer.clear(&caller, &method, &spelled, key, &read).await {
        Ok(true) => {
            tracing::warn!(route = %method, path = %spelled, "an idempotency record was cleared by an operator");
            shown["cleared"] = true.into();
            json(StatusCode::OK, &shown)
        }
        Ok(false) => problem(
            StatusCode::CONFLICT,
            "record_changed",
            "The record changed since it was read (completed, renewed or taken over): read it again.".into(),
        ),
        Err(e) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "guard_unavailable",
            format!("The store: {e}"),
        ),
    }
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
    let mut res = issue(&live, req);
    super::cors::allow(&live.cors, origin.as_ref(), res.headers_mut());
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

/// How often the store is probed for `healthz`.
const PROBE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Asks the store whether it answers, every [`PROBE_EVERY`], into
/// `answers`, until the gateway is gone: one conditional delete whose
/// condition never holds (it writes nothing; the store trait has no
/// `PING`), through the same budget and breaker as every guard.
pub(super) async fn probe_store(
    store: super::SharedStore,
    answers: std::sync::Weak<std::sync::atomic::AtomicBool>,
) {
    loop {
        let ok = store
            .delete_if_equals(PROBE_KEY, b"\0never written")
            .await
            .is_ok();
        let Some(answers) = answers.upgrade() else {
            return;
        };
        answers.store(ok, std::sync::atomic::Ordering::Release);
        drop(answers);
        tokio::time::sleep(PROBE_EVERY).await;
    }
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
