//! One request's path, top to bottom, in the order of its phases (as
//! Pingora's `proxy_trait.rs` reads). Each phase's code lives in the
//! folder named after it; this file calls them in order:
//!
//! | phase | where | what |
//! |---|---|---|
//! | accept | `listen/` | a connection taken under `max_connections`, timed by its phase (`listen/timed.rs`), read by the lane (`listen/lane.rs`) or hyper |
//! | read head | `head.rs` | what is refused from the head alone ([`not_forwarded`]), what is dropped before anything reads it ([`drop_nominated`], [`only_allowed_upgrades`]); the request id ([`dispatch`]) |
//! | choose route | `route/` | the site (`hosts`: 421), the route on the normalized path or a refusal of a spelling that would pass a guard by ([`choose`]) |
//! | identify | `identify/` | the backend asked who the caller is, on a route that reads the caller and whose identity is `introspect` ([`identify`]); the caller, scoped by site, read by the route's layers |
//! | guard | `route/stack.rs` | the route's rate limit, then its guard (the library's layers) |
//! | upstream | `upstream/` | the request forwarded, its answer brought back |
//! | answer | [`finish`] | the outcome named, from what the answer carries (a problem, a replay, a fail-open) |
//! | log | `log/` | the access-log line and the metrics |
//!
//! [`dispatch`] is the front door every reader calls (hyper's service, the
//! lane's routed requests); [`route_request`] runs the phases from the
//! head on.
use crate::config::{normalize_path, route_spelling};
use crate::serve::answers::{
    client_body_broke, invalid_request, misdirected, records_lost, upstream_switched,
    upstream_timeout, upstream_unavailable,
};
use crate::serve::cors::route_preflight;
use crate::serve::gateway::Gateway;
use crate::serve::head::{FORWARDING, drop_nominated, not_forwarded, only_allowed_upgrades};
use crate::serve::identify::caller::with_peer;
use crate::serve::identify::identify;
use crate::serve::log::metrics::{Counted, INVALID, Outcome, RouteMetrics, of_code};
use crate::serve::log::{access, request_id};
use crate::serve::reply::ForClient;
use crate::serve::route::table::Routes;
use crate::serve::route::{Choice, Chosen, ChosenIn, choose_request};
use crate::serve::upstream::{Failure, forward};
use axum::body::Body;
use axum::extract::OriginalUri;
use http::uri::PathAndQuery;
use http::{Request, Response, Uri};
use norepeat::degrade::{DecidedLocally, FailedOpen};
use norepeat::idempotency::Replayed;
use norepeat::problem::Problem;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tower::ServiceExt;

/// How long an unmatched request's upstream has to answer.
pub(crate) const PASSTHROUGH_TIMEOUT: Duration = Duration::from_secs(30);

/// Any request not for the gateway's own routes. Routes are matched on
/// the normalized path ([`normalize_path`]); a matched request goes on
/// with that path (its guard's key and the backend see it), an unmatched
/// one is forwarded untouched. `chosen`: the route the lane chose, with
/// the routes it chose it in (`None`: chosen here).
pub(crate) async fn dispatch(
    gw: Arc<Gateway>,
    mut req: Request<Body>,
    chosen: Option<ChosenIn>,
) -> Response<Body> {
    with_peer(req.extensions_mut());
    // Before the gateway adds a header of its own (the request id here,
    // `Idempotency-Attempt` in the layer): a client's `Connection` may
    // name the headers it sent, never the gateway's.
    drop_nominated(req.headers_mut());
    // A request id from outside `trusted_proxies` is the client's to
    // choose: replaced, as Envoy does at the edge.
    // One load of the routes per request: the match and the caller read it.
    let (live, chosen) = match chosen {
        Some((live, chosen)) => (live, Some(chosen)),
        None => (gw.live.load_full(), None),
    };
    let trusted = live.caller.peer_is_trusted(req.extensions());
    let id = request_id::request_id(req.headers_mut(), trusted);
    let http1 = req.version() < http::Version::HTTP_2;
    // The route, once one takes the request: the line of a client that
    // leaves before its answer names it.
    let named = OnceLock::new();
    // `on_data_loss.hold`: the idempotency routes whose records the store
    // kept wait, after a loss, for this long (read only once a loss was
    // seen: an atomic load otherwise).
    let lost_at = gw
        .store_lost_data_at
        .load(std::sync::atomic::Ordering::Acquire);
    if lost_at != 0 && gw.records.is_none() {
        req.extensions_mut().insert(HoldSince(lost_at));
    }
    let mut res = match &gw.access {
        None => route_request((live, chosen), trusted, req, None).await.0,
        Some(sink) => {
            // Owed from here: a client that leaves before its answer gets
            // its line too (499 `client_closed`).
            // The peer, as NGINX's `$remote_addr`.
            let client = req
                .extensions()
                .get::<norepeat::ratelimit::PeerAddr>()
                .map(|p| p.0.ip());
            let bytes_in = http_body::Body::size_hint(req.body()).exact();
            let host = req.headers().get(http::header::HOST).map(|h| h.as_bytes());
            let mut owed = access::Owed::new(sink, &id, req.method(), req.uri().path())
                .routed_by(&named)
                .from(client, host, bytes_in);
            let told = Arc::new(access::UpstreamTime::default());
            req.extensions_mut().insert(Arc::clone(&told));
            let (res, route, outcome) =
                route_request((live, chosen), trusted, req, Some(&named)).await;
            let route = route.as_deref().map(RouteMetrics::label);
            owed.with_answer(
                told.status(),
                http_body::Body::size_hint(res.body()).exact(),
            );
            owed.answered(route, res.status().as_u16(), outcome, told.get());
            res
        }
    };
    res.headers_mut().insert(request_id::REQUEST_ID, id);
    leave_if_draining(&gw, http1, &mut res);
    res
}

/// While draining, an HTTP/1 client is told to leave its keep-alive
/// connection (as Envoy's drain does): its next request goes to another
/// instance instead of meeting the listener's close. Called once the
/// answer is made (the gateway's own routes' too), so that a drain that
/// began while the request was served reaches its answer: read before,
/// a readiness probe in flight as the drain began got 503 `draining`
/// without `Connection: close` (seen once in a full test run).
pub(crate) fn leave_if_draining<B>(gw: &Gateway, http1: bool, res: &mut Response<B>) {
    if http1 && gw.draining.started() {
        res.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
}

/// A request through its route (or straight through): the answer, as its
/// client asked for it (`reply.rs`: CORS, a browser's refusal page), the
/// route that took it, and its outcome as the access log names it.
pub(crate) async fn route_request(
    (live, chosen): (Arc<Routes>, Option<Chosen>),
    trusted: bool,
    req: Request<Body>,
    named: Option<&OnceLock<Arc<RouteMetrics>>>,
) -> (Response<Body>, Option<Arc<RouteMetrics>>, &'static str) {
    let client = ForClient::of(&live, &req);
    let (res, route, outcome) = route_phases((live, chosen), trusted, req, named).await;
    let routed = route.is_some();
    (client.shape(res, routed), route, outcome)
}

async fn route_phases(
    (live, chosen): (Arc<Routes>, Option<Chosen>),
    trusted: bool,
    mut req: Request<Body>,
    named: Option<&OnceLock<Arc<RouteMetrics>>>,
) -> (Response<Body>, Option<Arc<RouteMetrics>>, &'static str) {
    // The asterisk form (`OPTIONS *`) names no resource: there is no route
    // to match, and no upstream URL to make of it. The client's request,
    // so a 400 of the gateway's, not a 502.
    if let Some(why) = not_forwarded(&req) {
        return (invalid_request(why), None, "invalid_request");
    }
    if !trusted {
        // What a client wrote there is not what a proxy of ours saw: the
        // gateway writes its own (in `upstream`), never appends to theirs.
        // One pass over the names first: the common request has none, and
        // a removal hashes its name even when it finds nothing.
        let h = req.headers_mut();
        if h.keys().any(|n| FORWARDING.contains(n)) {
            for name in &FORWARDING {
                h.remove(name);
            }
        }
    }
    // The lane's choice, or the head read now.
    let (normalized, site, choice) = match chosen {
        Some(Chosen {
            normalized,
            site,
            choice,
        }) => (normalized, site, Some(choice)),
        None => {
            let normalized = match normalize_path(req.uri().path()) {
                std::borrow::Cow::Borrowed(_) => None,
                std::borrow::Cow::Owned(p) => Some(p),
            };
            let site = (live.by_host || !live.hosts.is_empty())
                .then(|| crate::serve::identify::scope::site(req.headers(), req.uri()))
                .flatten();
            (normalized, site, None)
        }
    };
    // `hosts`: the site's names; any other is another site's request,
    // which no route of this file was written for.
    if !live.hosts.is_empty() && site.as_ref().is_none_or(|s| !live.hosts.contains(s)) {
        return (misdirected(), None, "misdirected_request");
    }
    if req.headers().contains_key(http::header::UPGRADE) {
        only_allowed_upgrades(req.headers_mut(), &live.upgrades);
    }
    let path = normalized.as_deref().unwrap_or(req.uri().path());
    let sent = req.uri().path();
    let method = req.method().as_str();
    let choice = choice.unwrap_or_else(|| {
        choose_request(&live, (method, path, sent), site.as_ref(), req.headers())
    });
    let (found_at, keyed) = match choice {
        Choice::Refused(why) => return (invalid_request(why), None, "invalid_request"),
        Choice::Preflight => return (route_preflight(req.headers()), None, "preflight"),
        Choice::Passthrough => (None, None),
        Choice::Route { at, keyed } => (Some(at), keyed),
    };
    let found = found_at.map(|i| &live.list[i]);
    // A guarded route decides on one request and its one answer: a
    // connection that switches protocols is neither.
    if found.is_some_and(|r| r.guarded) && req.headers().contains_key(http::header::UPGRADE) {
        let why = "A guarded route does not switch protocols: a request with Upgrade (a WebSocket) is refused here.";
        return (invalid_request(why), None, "invalid_request");
    }
    if found.is_some() {
        let key = route_spelling(keyed.as_deref().unwrap_or(path));
        // The common request, already in the route's one spelling, keeps
        // its URI as it is: no copy.
        if normalized.is_some() || *key != *req.uri().path() {
            let key = key.into_owned();
            set_path(&mut req, normalized.as_deref(), &key);
        }
    }
    let Some(route) = found else {
        let start = std::time::Instant::now();
        let told = req.extensions().get::<Arc<access::UpstreamTime>>().cloned();
        let answer = forward(live.passthrough.get(), PASSTHROUGH_TIMEOUT, None, req).await;
        access::UpstreamTime::note(told.as_ref(), start.elapsed());
        if let Ok(res) = &answer {
            access::UpstreamTime::note_status(told.as_ref(), res.status().as_u16());
        }
        return match answer {
            Ok(res) => (res, None, "passthrough"),
            Err(Failure::Unavailable) => (upstream_unavailable(), None, "upstream_unavailable"),
            Err(Failure::ClientBody) => (client_body_broke(), None, "invalid_request"),
            Err(Failure::Timeout) => (upstream_timeout(), None, "upstream_timeout"),
            Err(Failure::Switched) => (upstream_switched(), None, "upstream_switched_protocols"),
        };
    };
    if let Some(named) = named {
        let _ = named.set(Arc::clone(&route.metrics));
    }
    if let Some(HoldSince(at)) = req.extensions().get::<HoldSince>().copied()
        && route.records.is_some()
        && live.data_loss_hold_until(at)
    {
        route.metrics.count(Counted::Request(Outcome::Unavailable));
        route.metrics.answered(503);
        return (
            records_lost(),
            Some(Arc::clone(&route.metrics)),
            "records_lost",
        );
    }
    // identify: a caller the backend names (`introspect`) is asked.
    let res = match identify(&route.caller, req).await {
        Ok(req) => match route.service.clone().oneshot(req).await {
            Ok(res) => res,
            Err(never) => match never {},
        },
        Err(refused) => refused,
    };
    // Before `finish`, which may answer with a response of its own.
    let store_failed = crate::serve::log::metrics::count_shadowed(&route.metrics, &res);
    let counted = finish(&res, store_failed);
    route.metrics.count(counted);
    route.metrics.answered(res.status().as_u16());
    let outcome = match counted {
        Counted::Request(o) => o.as_str(),
        Counted::Invalid(i) => INVALID.get(i).copied().unwrap_or("invalid_request"),
    };
    (res, Some(Arc::clone(&route.metrics)), outcome)
}

/// Puts `forwarded` (the normalized path, when it differs from the
/// request's) in `req`'s URI, the query kept, and `key` (the route's one
/// spelling, [`route_spelling`]) in axum's `OriginalUri`, which the layers
/// read the concrete path from: the backend sees what was matched, and the
/// guards key every spelling of the route as one.
fn set_path(req: &mut Request<Body>, forwarded: Option<&str>, key: &str) {
    let with_query = |path: &str| match req.uri().query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_owned(),
    };
    let uri_with = |uri: &Uri, path: String| {
        let pq = PathAndQuery::from_maybe_shared(path).ok()?;
        let mut parts = uri.clone().into_parts();
        parts.path_and_query = Some(pq);
        Uri::from_parts(parts).ok()
    };
    let keyed = uri_with(req.uri(), with_query(key));
    if let Some(path) = forwarded
        && let Some(uri) = uri_with(req.uri(), with_query(path))
    {
        *req.uri_mut() = uri;
    }
    if let Some(uri) = keyed {
        req.extensions_mut().insert(OriginalUri(uri));
    }
}

/// When (Unix ms) the store lost its data, on a request whose idempotency
/// records it kept (see `on_data_loss.hold`).
#[derive(Debug, Clone, Copy)]
struct HoldSince(u64);

/// Names the outcome of a routed request's answer. It failed open when
/// the store failed its decision and it went through anyway: admitted
/// undecided ([`FailedOpen`]) or by the local memory of a fail-open route
/// ([`DecidedLocally`]), or `store_failed`, a shadowed guard's store failed.
/// It was replayed when the library's layer replayed it ([`Replayed`]):
/// an `Idempotent-Replayed` header alone may be the backend's own.
pub(crate) fn finish(res: &Response<Body>, store_failed: bool) -> Counted {
    if let Some(p) = res.extensions().get::<Problem>() {
        return of_code(p.code.as_str());
    }
    let ext = res.extensions();
    let failed_open = ext.get::<FailedOpen>().is_some() || ext.get::<DecidedLocally>().is_some();
    let outcome = if failed_open || store_failed {
        Outcome::FailOpen
    } else if ext.get::<Replayed>().is_some() {
        Outcome::Replayed
    } else {
        Outcome::Passed
    };
    Counted::Request(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the layer's replay is counted as one: a backend's own
    /// `Idempotent-Replayed` on an answer the layer passed on is a request
    /// that passed.
    #[test]
    fn a_replay_is_counted_only_where_the_gateway_replays() {
        let answer = |replayed: bool| {
            let mut res = Response::builder()
                .header(norepeat::idempotency::IDEMPOTENT_REPLAYED, "true")
                .body(Body::empty())
                .unwrap();
            if replayed {
                res.extensions_mut().insert(Replayed);
            }
            res
        };
        let outcome = |replayed| match finish(&answer(replayed), false) {
            Counted::Request(o) => o.as_str(),
            Counted::Invalid(_) => "invalid",
        };
        assert_eq!(outcome(true), Outcome::Replayed.as_str());
        assert_eq!(outcome(false), Outcome::Passed.as_str());
    }
}
