//! The admin listener's record route: one key's record read, or cleared
//! when it still holds what was read (how an operator resolves an
//! `idempotency_outcome_unknown`).

use super::json;
use crate::config::{normalize_host, normalize_path, route_spelling};
use crate::serve::gateway::Gateway;
use crate::serve::identify::scope::HostScoped;
use axum::body::Body;
use axum::extract::Query;
use axum::extract::{Request, State};
use http::{Response, StatusCode, header};
use norepeat::idempotency::RecordState;
use norepeat::identity::Identify;
use norepeat::problem::Problem;
use norepeat::ratelimit::PeerAddr;
use std::collections::HashMap;
use std::sync::Arc;

/// The header that carries the admin token (not `Authorization`, which may
/// be the identity the record is scoped by).
const ADMIN_TOKEN: &str = "norepeat-admin-token";

/// `GET` or `DELETE /.norepeat/admin/record?method=POST&path=/payments&key=K[&host=H]`
/// with the admin token, and the headers that name the caller as the
/// client sent them (`X-User-Id: 42`, ...): that key's record on the
/// idempotency route taking `method path`, read, or cleared when it still
/// holds what was read (the key then runs again: for an operator who has
/// checked what the backend did with an `idempotency_outcome_unknown`).
pub(super) async fn record(
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
    // `client=ADDRESS`: the client's address, for a caller identified by
    // it (the admin request's own address is not the client's).
    if let Some(client) = params.get("client") {
        let Ok(ip) = client.parse::<std::net::IpAddr>() else {
            return problem(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                format!("client={client:?} is no IP address."),
            );
        };
        parts
            .extensions
            .insert(PeerAddr(std::net::SocketAddr::new(ip, 0)));
    }
    parts.headers.remove(header::HOST);
    if let Ok(h) = header::HeaderValue::from_str(host) {
        parts.headers.insert(header::HOST, h);
    }
    // A caller the backend names is asked with the client's headers.
    let asked = http::Request::from_parts(parts, Body::empty());
    let parts = match crate::serve::identify::identify(route_caller, asked).await {
        Ok(req) => req.into_parts().0,
        Err(refused) => return refused,
    };
    let Some(caller) = HostScoped::new(route_caller.clone())
        .site(live.site.clone())
        .identify(&parts)
    else {
        return problem(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!(
                "No caller: send the headers the client sent (and client=ADDRESS for a caller identified by its address). {}",
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
        RecordState::OutcomeUnknown { attempt, status } => serde_json::json!({
            "state": "outcome_unknown",
            "attempt": attempt,
            "status": status.as_u16(),
        }),
        RecordState::Completed {
            status,
            headers,
            body_len,
        } => serde_json::json!({
            "state": "completed",
            "status": status.as_u16(),
            "headers": headers,
            "body_len": body_len,
        }),
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
    let force = params.get("force").is_some_and(|f| f == "true");
    if shown["state"] == "completed" && !force {
        // Its answer is known and replayed: cleared, the key's retry would
        // run the effect again.
        return problem(
            StatusCode::CONFLICT,
            "record_completed",
            "The key's request completed and its answer is replayed to retries; clearing it would let the next retry run the effect again. Add force=true to clear it all the same.".into(),
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
