//! One request's path, in call order (as Pingora's proxy phases read):
//! [`dispatch`] names it (`X-Request-Id`) and logs it; [`route_request`]
//! refuses what a backend could read otherwise ([`not_forwarded`]), matches
//! the route on the normalized path (or refuses a spelling that would pass
//! a guard by, [`other_spelling`]), keys it by the route's one spelling
//! ([`set_path`]), and either forwards it untouched or sends it through its
//! route's stack (rate limit, guard, upstream stage: `stack.rs`); then
//! [`finish`] turns the upstream stage's unknown outcome into the client's
//! answer and names the outcome the metrics count.

use super::OUTCOME_HEADER;
use super::access;
use super::answers::{
    client_body_broke, invalid_request, misdirected, outcome_unknown, upstream_switched,
    upstream_timeout, upstream_unavailable,
};
use super::caller::with_peer;
use super::forward::{Failure, forward};
use super::gateway::{Gateway, Routes};
use super::metrics::{Counted, INVALID, Outcome, RouteMetrics, of_code};
use super::store::STORE_FAILED;
use crate::config::{
    normalize_host, normalize_path, route_spelling, with_slashes_decoded, without_format_suffix,
};
use axum::body::Body;
use axum::extract::OriginalUri;
use http::uri::PathAndQuery;
use http::{HeaderName, Request, Response, StatusCode, Uri};
use norepeat::degrade::FailedOpen;
use norepeat::idempotency::IDEMPOTENT_REPLAYED;
use norepeat::problem::Problem;
use std::cell::Cell;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tower::ServiceExt;

/// How long an unmatched request's upstream has to answer.
pub(super) const PASSTHROUGH_TIMEOUT: Duration = Duration::from_secs(30);

/// Any request not for the gateway's own routes. Routes are matched on
/// the normalized path ([`normalize_path`]); a matched request goes on
/// with that path (its guard's key and the backend see it), an unmatched
/// one is forwarded untouched.
pub(super) async fn dispatch(gw: Arc<Gateway>, mut req: Request<Body>) -> Response<Body> {
    with_peer(req.extensions_mut());
    // Before the gateway adds a header of its own (the request id here,
    // `Idempotency-Attempt` in the layer): a client's `Connection` may
    // name the headers it sent, never the gateway's.
    drop_nominated(req.headers_mut());
    // A request id from outside `trusted_proxies` is the client's to
    // choose: replaced, as Envoy does at the edge.
    // One load of the routes per request: the match and the caller read it.
    let live = gw.live.load_full();
    let trusted = live.caller.peer_is_trusted(req.extensions());
    let id = access::request_id(req.headers_mut(), trusted);
    // While draining, an HTTP/1 client is told to leave its keep-alive
    // connection (as Envoy's drain does): its next request goes to another
    // instance instead of meeting the listener's close.
    let leave = gw.draining.started() && req.version() < http::Version::HTTP_2;
    // The route, once one takes the request: the line of a client that
    // leaves before its answer names it.
    let chosen = OnceLock::new();
    let mut res = match &gw.access {
        None => route_request(live, trusted, req, None).await.0,
        Some(sink) => {
            // Owed from here: a client that leaves before its answer gets
            // its line too (499 `client_closed`).
            let owed =
                access::Owed::new(sink, &id, req.method(), req.uri().path()).routed_by(&chosen);
            let ((res, route, outcome), upstream) = access::UPSTREAM
                .scope(Cell::new(None), async {
                    let answer = route_request(live, trusted, req, Some(&chosen)).await;
                    (answer, access::UPSTREAM.with(Cell::get))
                })
                .await;
            let route = route.as_deref().map(RouteMetrics::label);
            owed.answered(route, res.status().as_u16(), outcome, upstream);
            res
        }
    };
    res.headers_mut().insert(access::REQUEST_ID, id);
    if leave {
        res.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
    res
}

/// A request through its route (or straight through): the answer, the
/// route that took it, and its outcome as the access log names it.
pub(super) async fn route_request(
    live: Arc<Routes>,
    trusted: bool,
    mut req: Request<Body>,
    chosen: Option<&OnceLock<Arc<RouteMetrics>>>,
) -> (Response<Body>, Option<Arc<RouteMetrics>>, &'static str) {
    // The asterisk form (`OPTIONS *`) names no resource: there is no route
    // to match, and no upstream URL to make of it. The client's request,
    // so a 400 of the gateway's, not a 502.
    if let Some(why) = not_forwarded(&req) {
        return (invalid_request(why), None, "invalid_request");
    }
    if !trusted {
        // What a client wrote there is not what a proxy of ours saw: the
        // gateway writes its own (in `forward`), never appends to theirs.
        // One pass over the names first: the common request has none, and
        // a removal hashes its name even when it finds nothing.
        let h = req.headers_mut();
        if h.keys().any(|n| FORWARDING.contains(n)) {
            for name in &FORWARDING {
                h.remove(name);
            }
        }
    }
    let normalized = match normalize_path(req.uri().path()) {
        std::borrow::Cow::Borrowed(_) => None,
        std::borrow::Cow::Owned(p) => Some(p),
    };
    let site = (live.by_host || !live.hosts.is_empty())
        .then(|| super::scope::site(req.headers(), req.uri()))
        .flatten();
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
    let (found_at, keyed) = match choose(&live, req.method().as_str(), path, sent, site.as_ref()) {
        Choice::Refused(why) => return (invalid_request(why), None, "invalid_request"),
        Choice::Passthrough => (None, None),
        Choice::Route { at, keyed } => (Some(at), keyed),
    };
    let found = found_at.map(|i| &live.list[i]);
    // A guarded route decides on one request and its one answer: a
    // connection that switches protocols is neither (GATEWAY.md).
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
        let answer = forward(live.passthrough.get(), PASSTHROUGH_TIMEOUT, None, req).await;
        access::note_upstream(start.elapsed());
        return match answer {
            Ok(res) => (res, None, "passthrough"),
            Err(Failure::Unavailable) => (upstream_unavailable(), None, "upstream_unavailable"),
            Err(Failure::ClientBody) => (client_body_broke(), None, "invalid_request"),
            Err(Failure::Timeout) => (upstream_timeout(), None, "upstream_timeout"),
            Err(Failure::Switched) => (upstream_switched(), None, "upstream_switched_protocols"),
        };
    };
    if let Some(chosen) = chosen {
        let _ = chosen.set(Arc::clone(&route.metrics));
    }
    let (res, decided_locally) = STORE_FAILED
        .scope(Cell::new(false), async {
            let res = match route.service.clone().oneshot(req).await {
                Ok(res) => res,
                Err(never) => match never {},
            };
            (res, STORE_FAILED.with(Cell::get))
        })
        .await;
    // Before `finish`, which may answer with a response of its own.
    let store_failed = super::metrics::count_shadowed(&route.metrics, &res);
    // Let through by the local memory, the store down: failed open.
    // A replay is a replay, whatever decided it (the local memory too).
    let replayed = res.headers().contains_key(IDEMPOTENT_REPLAYED);
    let (res, counted) = finish(res, store_failed || (decided_locally && !replayed));
    route.metrics.count(counted);
    let outcome = match counted {
        Counted::Request(o) => o.as_str(),
        Counted::Invalid(i) => INVALID.get(i).copied().unwrap_or("invalid_request"),
    };
    (res, Some(Arc::clone(&route.metrics)), outcome)
}

/// Which way a request goes, from its method, its normalized path and
/// its site: what [`route_request`] and the pass-through's lane
/// (`passthrough.rs`) both decide by.
pub(super) enum Choice {
    /// Refused 400 `invalid_request`: a spelling of a guarded route that
    /// would pass it by ([`other_spelling`]).
    Refused(&'static str),
    /// No route: straight through.
    Passthrough,
    /// The route at `at` in the list; `keyed`: the spelling without a
    /// format suffix it was found by, if it was.
    Route { at: usize, keyed: Option<String> },
}

/// The route `method` and `path` (normalized; `sent`, as the client sent
/// it) take on `site`, the first that matches; or the pass-through; or a
/// refusal.
pub(super) fn choose(
    live: &Routes,
    method: &str,
    path: &str,
    sent: &str,
    site: Option<&String>,
) -> Choice {
    let find = |p: &str| {
        live.list.iter().position(|r| {
            r.matcher.matches(method, p) && r.host.as_ref().is_none_or(|h| site == Some(h))
        })
    };
    // No route, or one that only routes (`ANY /api/{*rest}`): another
    // spelling of a guarded route listed before it must not pass by it.
    let unguarded = |at: Option<usize>| at.is_none_or(|i| !live.list[i].guarded);
    // A format suffix the back end drops (`/payments.json`) is the route
    // too, keyed as its spelling without it: the route that spelling
    // takes, when it is guarded or when nothing took the suffixed one.
    let mut keyed = None;
    let mut found_at = find(path);
    if unguarded(found_at)
        && let Some(plain) = without_format_suffix(path)
    {
        let plain_at = find(&plain);
        if !unguarded(plain_at) || (found_at.is_none() && plain_at.is_some()) {
            found_at = plain_at;
            keyed = Some(plain);
        }
    }
    if unguarded(found_at) {
        let before = found_at.unwrap_or(live.list.len());
        if let Some(why) = other_spelling(live, before, site, method, path, sent) {
            return Choice::Refused(why);
        }
    }
    match found_at {
        Some(at) => Choice::Route { at, keyed },
        None => Choice::Passthrough,
    }
}

/// Removes the headers the client's `Connection` names (RFC 9110 §7.6.1),
/// and leaves in `Connection` only the options the gateway reads itself
/// (`close`, `keep-alive`, `upgrade`): what it names is gone before the
/// gateway adds its own headers, so a client can never have one of those
/// removed (`Connection: Idempotency-Attempt`). The fixed hop-by-hop
/// headers are dropped on the way out (`forward`).
pub(super) fn drop_nominated(headers: &mut http::HeaderMap) {
    let Some(first) = headers.get(http::header::CONNECTION) else {
        return;
    };
    let options = |t: &str| {
        t.eq_ignore_ascii_case("close")
            || t.eq_ignore_ascii_case("keep-alive")
            || t.eq_ignore_ascii_case("upgrade")
    };
    // The common values (`keep-alive`, `close`, `Upgrade`): nothing to do.
    let one = headers.get_all(http::header::CONNECTION).iter().count() == 1;
    if one
        && first
            .to_str()
            .is_ok_and(|v| v.split(',').map(str::trim).all(options))
    {
        return;
    }
    let mut named = Vec::new();
    let mut kept: Vec<&'static str> = Vec::new();
    for token in headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
    {
        for (option, spelled) in [
            ("close", "close"),
            ("keep-alive", "keep-alive"),
            ("upgrade", "upgrade"),
        ] {
            if token.eq_ignore_ascii_case(option) && !kept.contains(&spelled) {
                kept.push(spelled);
            }
        }
        if !options(token)
            && let Ok(n) = HeaderName::from_bytes(token.as_bytes())
            && n != http::header::HOST
        {
            named.push(n);
        }
    }
    for n in named {
        headers.remove(n);
    }
    headers.remove(http::header::CONNECTION);
    if !kept.is_empty()
        && let Ok(v) = http::HeaderValue::from_str(&kept.join(", "))
    {
        headers.insert(http::header::CONNECTION, v);
    }
}

/// Leaves in `Upgrade` only the protocols `allowed` names (the file's
/// `upgrades`; `h2c` never is), or removes it, and `upgrade` from
/// `Connection`, when none is left: such a request goes on as a plain one,
/// as NGINX sends it without `Upgrade` unless told to.
fn only_allowed_upgrades(headers: &mut http::HeaderMap, allowed: &[String]) {
    let name = |p: &str| {
        p.split('/')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase()
    };
    let asked: Vec<String> = headers
        .get_all(http::header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect();
    let kept: Vec<&str> = asked
        .iter()
        .filter(|p| allowed.contains(&name(p)))
        .map(String::as_str)
        .collect();
    if kept.len() == asked.len() && !kept.is_empty() {
        return;
    }
    headers.remove(http::header::UPGRADE);
    if kept.is_empty() {
        tracing::debug!(asked = ?asked, "an Upgrade not in `upgrades`: forwarded without it");
        let rest: Vec<String> = headers
            .get_all(http::header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|s| s.split(','))
            .map(str::trim)
            .filter(|t| !t.is_empty() && !t.eq_ignore_ascii_case("upgrade"))
            .map(str::to_owned)
            .collect();
        headers.remove(http::header::CONNECTION);
        if let Ok(v) = http::HeaderValue::from_str(&rest.join(", "))
            && !rest.is_empty()
        {
            headers.insert(http::header::CONNECTION, v);
        }
    } else if let Ok(v) = http::HeaderValue::from_str(&kept.join(", ")) {
        headers.insert(http::header::UPGRADE, v);
    }
}

/// The forwarding headers a client outside `trusted_proxies` may not set.
static FORWARDING: [HeaderName; 4] = [
    http::header::FORWARDED,
    super::forward::X_FORWARDED_FOR,
    super::forward::X_FORWARDED_HOST,
    super::forward::X_FORWARDED_PROTO,
];

/// Why `req` is not forwarded, if it is one a backend could read otherwise
/// than the gateway did (RFC 9112 asks a server to answer these 400). Both
/// `Content-Length` and `Transfer-Encoding` need no check here: hyper reads
/// such a body by the latter and drops the former. A request without a
/// `Host` is forwarded (the upstream's host is sent): a request built in
/// process, as tests and embedders make them, has none.
fn not_forwarded(req: &Request<Body>) -> Option<&'static str> {
    let headers = req.headers();
    let hosts = headers.get_all(http::header::HOST).iter().count();
    if !req.uri().path().starts_with('/') {
        Some(
            "The gateway forwards requests for a path (a target starting with /); `*` and other forms are not forwarded.",
        )
    } else if req
        .method()
        .as_str()
        .bytes()
        .any(|b| b.is_ascii_lowercase())
    {
        // Methods are case-sensitive (RFC 9110 §9.1), but the backends in
        // front of which the gateway stands are not all so: werkzeug takes
        // `post` for POST. A spelling the backend takes alike must not pass
        // unguarded, so none but the upper case passes.
        Some("The method must be in upper case (`POST`, not `post`).")
    } else if hosts > 1 {
        Some("The request carries more than one Host header.")
    } else if let Some(host) = headers.get(http::header::HOST)
        && !host.as_bytes().iter().all(u8::is_ascii_graphic)
    {
        // The site keys and routes are chosen by; a byte a backend reads
        // its own way has no place in it.
        Some("The Host header must be visible ASCII.")
    } else if let Some(host) = headers.get(http::header::HOST)
        && (host.as_bytes().contains(&b'@') || host.as_bytes().windows(2).any(|w| w == b".."))
    {
        // `x@pay.example` (userinfo, which RFC 9110 §4.2.4 forbids here)
        // and `pay.example..` name a site one reader takes for another.
        Some("The Host header must name a host: no userinfo (@) and no empty label (..).")
    } else if req
        .uri()
        .authority()
        .is_some_and(|a| a.as_str().contains('@') || a.as_str().contains(".."))
    {
        Some(
            "The request target's authority must name a host: no userinfo (@) and no empty label (..).",
        )
    } else if let (Some(authority), Some(host)) =
        (req.uri().authority(), headers.get(http::header::HOST))
        && req.version() >= http::Version::HTTP_2
        && host.to_str().ok().and_then(normalize_host) != normalize_host(authority.as_str())
    {
        // RFC 9113 §8.3.1: an HTTP/2 request whose Host names another site
        // than its `:authority` is malformed (the gateway and the backend
        // could each take another). An HTTP/1.1 absolute-form target's
        // authority replaces its Host (RFC 9112 §3.2.2), as `forward` and
        // `scope::site` both read it.
        Some("The request's Host and its :authority name different sites.")
    } else if hosts == 0
        && req.version() == http::Version::HTTP_11
        && req.uri().authority().is_none()
        && req
            .extensions()
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .is_some()
    {
        // RFC 9112 §3.2: a server answers 400 to an HTTP/1.1 request
        // without Host. (A request made in process, which has no peer,
        // has none either, and goes on.)
        Some("An HTTP/1.1 request must carry a Host header.")
    } else {
        None
    }
}

/// Why a path that matches no route is refused: a spelling that a back
/// end would take for a route's path, and so run unguarded. An encoded
/// slash (`%2F`) that decodes onto a route (Flask and Express decode it;
/// Envoy can be told to refuse these too), or a path that is a route's in
/// another case (a back end that folds case serves it as the route).
fn other_spelling(
    live: &Routes,
    before: usize,
    site: Option<&String>,
    method: &str,
    path: &str,
    sent: &str,
) -> Option<&'static str> {
    const SLASH: &str = "The path has an encoded slash (%2F) or a backslash (\\ or %5C) that a back end reads as a slash onto a guarded route: refused, as it would reach the route unguarded.";
    const CASE: &str = "The path is a guarded route's in another case: refused, as a back end that folds case would run it unguarded. Use the route's own spelling.";
    // The guarded routes of this request's site listed before `before`
    // (the route that took the request, if any: one after it is not
    // reached by any spelling): another site's route is not this
    // request's to pass by.
    let guarded = || {
        live.list
            .iter()
            .take(before)
            .filter(|r| r.guarded && r.host.as_ref().is_none_or(|h| site == Some(h)))
    };
    let folded = |p: &str| guarded().any(|r| r.matcher.matches_ignoring_case(method, p));
    // The common case, a path that is no route's in any spelling, costs no
    // allocation: one look per route, and the rest only for a path with a
    // suffix or an encoded slash.
    if folded(path) {
        return Some(CASE);
    }
    if let Some(plain) = without_format_suffix(path)
        && folded(&plain)
    {
        return Some(CASE);
    }
    // From the path as sent: a back end resolves `..` after it has read
    // a backslash as a slash (`/payments\x/..` is its `/payments/`).
    let decoded = with_slashes_decoded(sent)?;
    let plain = without_format_suffix(&decoded);
    for p in std::iter::once(decoded.as_str()).chain(plain.as_deref()) {
        if guarded().any(|r| r.matcher.matches(method, p)) {
            return Some(SLASH);
        }
        if folded(p) {
            return Some(CASE);
        }
    }
    None
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

/// Turns the upstream stage's "unknown" record into the client's answer,
/// and names the outcome. `store_failed`: the store failed the request's
/// decision and it went through anyway (a shadowed guard would have
/// refused it, or the local memory of a fail-open route admitted it).
pub(super) fn finish(mut res: Response<Body>, store_failed: bool) -> (Response<Body>, Counted) {
    let replayed = res.headers().contains_key(IDEMPOTENT_REPLAYED);
    if let Some(outcome) = res.headers_mut().remove(OUTCOME_HEADER) {
        if replayed {
            return (outcome_unknown(), Counted::Request(Outcome::Unknown));
        }
        // The backend's own 500 or 504 (its status in the header): the
        // client gets the backend's answer as it was.
        let backend = outcome
            .to_str()
            .ok()
            .and_then(|s| s.parse::<u16>().ok())
            .and_then(|s| StatusCode::from_u16(s).ok());
        if let Some(status) = backend {
            *res.status_mut() = status;
            let open = res.extensions().get::<FailedOpen>().is_some() || store_failed;
            let outcome = if open {
                Outcome::FailOpen
            } else {
                Outcome::Passed
            };
            return (res, Counted::Request(outcome));
        }
        return (
            upstream_timeout(),
            Counted::Request(Outcome::UpstreamTimeout),
        );
    }
    if let Some(p) = res.extensions().get::<Problem>() {
        let counted = of_code(p.code.as_str());
        return (res, counted);
    }
    let outcome = if res.extensions().get::<FailedOpen>().is_some() || store_failed {
        Outcome::FailOpen
    } else if replayed {
        Outcome::Replayed
    } else {
        Outcome::Passed
    };
    (res, Counted::Request(outcome))
}
