// Over 400 lines on purpose: the identify phase, its one call per credential and its cache (about 330 lines) beside the unit tests of what is asked, with what, and when.
//! `identity.introspect`: the backend says who the caller is, as NGINX's
//! `auth_request` and Traefik's `forwardAuth` ask theirs. A session cookie
//! the backend re-signs on every answer (Flask's, Rails') is a new value
//! on every request, so a cookie identity made a retry with the refreshed
//! cookie a new caller; the user the backend names is the same one.
//!
//! The identify phase ([`identify`]) runs before a guarded route's stack:
//! the library's layers read the caller synchronously from the request
//! (`Caller::identify`), so the call to the backend is made here and its
//! answer put in the request's extensions ([`Introspected`]) for them.
//!
//! | the backend's answer to `GET path` | the request |
//! |---|---|
//! | 200 naming the user (a header, or a string or number at a JSON pointer) | goes on as that user's (`i:` and the user's hash) |
//! | 401 or 403 | 401 `unauthenticated` |
//! | anything else, a 200 that names no user, nothing within `timeout` | 503 `guard_unavailable`, `Retry-After: 1` |
//! | (not asked: no `Cookie` and no `Authorization`) | no identity: the file's `required` decides (401, or the address) |
//!
//! The call carries the client's `Cookie` and `Authorization` only (and
//! the forwarding headers `upstream` adds); the backend's `Set-Cookie`
//! goes nowhere. A user is kept per credential (a keyed hash of those two
//! headers: never their values) for `cache`, at most [`ANSWERS`] of them;
//! concurrent requests with one credential wait for one call ([`Flights`]).
//! Each call is counted in `norepeat_gateway_introspect_total{result}`
//! (`user`, `refused`, `unavailable`).

use crate::config::{Introspect, IntrospectUser, Upstream};
use crate::serve::head::FORWARDING;
use crate::serve::upstream::forward;
use crate::serve::upstream::pool::{Pool, Secure, client, connect_timeout};
use axum::body::Body;
use axum::extract::ConnectInfo;
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use norepeat::problem::{Code, Problem};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// The most users kept (one per credential); past it the least used go.
pub(crate) const ANSWERS: u64 = 10_000;

/// The largest body of the backend's answer that is read (a user is a
/// few bytes; a page is not an answer).
const MAX_BODY: usize = 64 * 1024;

/// The domain of a credential's hash.
const CREDENTIAL_KEY: &[u8; 32] = b"norepeat-gateway introspect v1\0\0";

/// A credential: the keyed hash of the client's `Cookie` and
/// `Authorization` headers.
type Credential = [u8; 32];

/// What the identify phase learnt, in the request's extensions: the
/// caller's id (`i:` and the user's hash), or `None` when the request
/// carries no credential to ask with.
#[derive(Debug, Clone)]
pub(crate) struct Introspected(pub(crate) Option<Arc<str>>);

/// What one call to the backend came to.
#[derive(Debug, Clone)]
enum Asked {
    /// The caller's id.
    User(Arc<str>),
    /// 401 or 403: the credential names no one.
    Refused,
    /// No usable answer: why, for the log and the 503's detail.
    Unavailable(&'static str),
}

/// The calls in flight, by credential: a request whose credential is
/// being asked about waits for that call's answer instead of making its
/// own. An entry lives as long as its call (the call removes it).
type Flights = Mutex<HashMap<Credential, watch::Receiver<Option<Asked>>>>;

/// One `identity.introspect` on one upstream: its calls and the users
/// they named.
pub(crate) struct Introspector {
    path: http::uri::PathAndQuery,
    user: User,
    timeout: Duration,
    /// The upstream asked: the route's (or the file's).
    pool: Pool,
    /// The users named, by credential, for `cache`.
    answers: moka::sync::Cache<Credential, Arc<str>>,
    flights: Arc<Flights>,
}

impl std::fmt::Debug for Introspector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Introspector")
            .field("path", &self.path)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// Where the answer names the user.
#[derive(Debug, Clone)]
enum User {
    Header(HeaderName),
    Json(Arc<str>),
}

impl Introspector {
    /// `introspect`, asking `upstream`.
    pub(crate) fn new(introspect: &Introspect, upstream: &Upstream) -> Self {
        // Both checked by the file's parser.
        let path = http::uri::PathAndQuery::try_from(introspect.path.as_str())
            .unwrap_or_else(|_| http::uri::PathAndQuery::from_static("/"));
        let user = match &introspect.user {
            IntrospectUser::Header(h) => HeaderName::from_bytes(h.as_bytes())
                .map_or_else(|_| User::Json(Arc::from("")), User::Header),
            IntrospectUser::Json(p) => User::Json(Arc::from(p.as_str())),
        };
        Self {
            path,
            user,
            timeout: introspect.timeout,
            pool: client(connect_timeout(introspect.timeout), upstream),
            answers: moka::sync::Cache::builder()
                .max_capacity(ANSWERS)
                .time_to_live(introspect.cache)
                .build(),
            flights: Arc::default(),
        }
    }

    /// What the backend says of the credential in `parts`: `Ok(None)`
    /// when there is none to ask with, else the caller's id or the
    /// client's answer.
    pub(crate) async fn ask(
        &self,
        parts: &Parts,
        trusted: bool,
    ) -> Result<Option<Arc<str>>, Response<Body>> {
        let Some(credential) = credential(&parts.headers) else {
            return Ok(None);
        };
        let mut waiting = {
            let mut flights = self.flights.lock().unwrap_or_else(|p| p.into_inner());
            // Under the lock: a call puts its user in `answers` before it
            // leaves `flights`, so one of the two has it.
            if let Some(id) = self.answers.get(&credential) {
                return Ok(Some(id));
            }
            match flights.get(&credential) {
                Some(rx) => rx.clone(),
                None => {
                    let (tx, rx) = watch::channel(None);
                    flights.insert(credential, rx.clone());
                    self.call(credential, self.request(parts, trusted), tx);
                    rx
                }
            }
        };
        // The call always ends (its own timeout) and always sends; a
        // sender gone without a word is a call that panicked.
        let asked = match waiting.wait_for(Option::is_some).await {
            Ok(a) => a.clone().unwrap_or(Asked::Unavailable("no answer")),
            Err(_) => Asked::Unavailable("no answer"),
        };
        match asked {
            Asked::User(id) => Ok(Some(id)),
            // The path asked stays in the log: it is the backend's, not
            // the client's to know.
            Asked::Refused => Err(Problem::new(Code::Unauthenticated)
                .detail("The backend names no one for this Cookie or Authorization (it answered 401 or 403).")
                .to_response()
                .map(Body::new)),
            Asked::Unavailable(why) => Err(Problem::new(Code::GuardUnavailable)
                .detail(format!(
                    "Who the caller is could not be learnt from the backend ({why}); retry shortly."
                ))
                .retry_after_secs(1)
                .to_response()
                .map(Body::new)),
        }
    }

    /// Starts the call for `credential`: a task of its own, so a client
    /// that leaves does not cancel the answer the others wait for. It
    /// keeps a user it learnt, leaves `flights`, then tells the waiting.
    fn call(&self, credential: Credential, req: Request<Body>, tx: watch::Sender<Option<Asked>>) {
        let client = Arc::clone(&self.pool);
        let (timeout, user) = (self.timeout, self.user.clone());
        let (answers, flights) = (self.answers.clone(), Arc::clone(&self.flights));
        let path = self.path.clone();
        tokio::spawn(async move {
            let asked = tokio::time::timeout(timeout, asked(&client, timeout, &user, req))
                .await
                .unwrap_or(Asked::Unavailable("no answer in time"));
            let result = match &asked {
                Asked::User(id) => {
                    answers.insert(credential, Arc::clone(id));
                    "user"
                }
                Asked::Refused => "refused",
                Asked::Unavailable(why) => {
                    tracing::warn!(%path, why, "identity.introspect: no user from the backend");
                    "unavailable"
                }
            };
            metrics::counter!("norepeat_gateway_introspect_total", "result" => result).increment(1);
            flights
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&credential);
            let _ = tx.send(Some(asked));
        });
    }

    /// `GET path` with what the client's request says of the caller: its
    /// `Cookie` (joined into one line, as HTTP/1.1 has it) and
    /// `Authorization`, its `Host`, the forwarding headers a `trusted`
    /// proxy sent, and its peer (for the ones `upstream` adds).
    fn request(&self, parts: &Parts, trusted: bool) -> Request<Body> {
        let mut req = Request::new(Body::empty());
        *req.uri_mut() = http::Uri::from(self.path.clone());
        let h = req.headers_mut();
        let cookies: Vec<&[u8]> = parts
            .headers
            .get_all(header::COOKIE)
            .iter()
            .map(HeaderValue::as_bytes)
            .collect();
        if let Ok(v) = HeaderValue::from_bytes(&cookies.join(&b"; "[..]))
            && !v.is_empty()
        {
            h.insert(header::COOKIE, v);
        }
        let kept = [header::AUTHORIZATION, header::HOST];
        let forwarded = if trusted { &FORWARDING[..] } else { &[] };
        for name in kept.iter().chain(forwarded) {
            for v in parts.headers.get_all(name) {
                h.append(name.clone(), v.clone());
            }
        }
        // HTTP/2 names the site in its `:authority`, not in `Host`.
        if !h.contains_key(header::HOST)
            && let Some(a) = parts.uri.authority()
            && let Ok(v) = HeaderValue::from_str(a.as_str())
        {
            h.insert(header::HOST, v);
        }
        if let Some(peer) = parts.extensions.get::<ConnectInfo<SocketAddr>>() {
            req.extensions_mut().insert(*peer);
        }
        if let Some(secure) = parts.extensions.get::<Secure>() {
            req.extensions_mut().insert(*secure);
        }
        req
    }
}

/// One call: the answer's status, then the user where the file says.
async fn asked(client: &Pool, timeout: Duration, user: &User, req: Request<Body>) -> Asked {
    let res = match forward(client.get(), timeout, Some(timeout), req).await {
        Ok(res) => res,
        Err(_) => return Asked::Unavailable("the upstream did not answer"),
    };
    let status = res.status();
    let (head, body) = res.into_parts();
    // Read (up to its cap) whatever the status: the connection goes back
    // to the pool at the body's end.
    let body = http_body_util::Limited::new(body, MAX_BODY).collect().await;
    match status {
        StatusCode::OK => {}
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => return Asked::Refused,
        s if s.is_server_error() => return Asked::Unavailable("the backend answered 5xx"),
        _ => return Asked::Unavailable("the backend answered neither 200 nor 401/403"),
    }
    let named = match user {
        User::Header(name) => one_header(&head.headers, name).map(<[u8]>::to_vec),
        User::Json(pointer) => body
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b.to_bytes()).ok())
            .and_then(|doc| match doc.pointer(pointer) {
                Some(serde_json::Value::String(s)) if !s.is_empty() => Some(s.clone().into_bytes()),
                Some(serde_json::Value::Number(n)) => Some(n.to_string().into_bytes()),
                _ => None,
            }),
    };
    match named {
        Some(user) if user.len() <= 8192 => {
            Asked::User(Arc::from(super::hash::hashed("i", &[&user])))
        }
        _ => Asked::Unavailable("its 200 names no user where the file says"),
    }
}

/// The one non-empty value of `name` in `headers`.
fn one_header<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a [u8]> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(v), None) if !v.is_empty() => Some(v.as_bytes()),
        _ => None,
    }
}

/// The keyed hash of the request's `Cookie` and `Authorization` lines;
/// `None` when it has neither (nothing to ask with).
fn credential(headers: &HeaderMap) -> Option<Credential> {
    let mut h = blake3::Hasher::new_keyed(CREDENTIAL_KEY);
    let mut any = false;
    for (tag, name) in [(b"c", header::COOKIE), (b"a", header::AUTHORIZATION)] {
        for v in headers.get_all(name).iter().filter(|v| !v.is_empty()) {
            any = true;
            h.update(tag);
            h.update(&(v.len() as u64).to_le_bytes());
            h.update(v.as_bytes());
        }
    }
    any.then(|| *h.finalize().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_is_its_cookie_and_authorization_hashed() {
        let of = |pairs: &[(&str, &str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.append(
                    HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    v.parse().unwrap(),
                );
            }
            credential(&h)
        };
        assert_eq!(of(&[]), None);
        assert_eq!(of(&[("x-user-id", "7")]), None);
        let c = of(&[("cookie", "session=abc")]).unwrap();
        assert_eq!(of(&[("cookie", "session=abc"), ("x-other", "1")]), Some(c));
        assert_ne!(of(&[("authorization", "session=abc")]), Some(c));
        assert_ne!(of(&[("cookie", "session=abd")]), Some(c));
        // Two lines are not one line of their bytes run together.
        assert_ne!(
            of(&[("cookie", "a=1"), ("cookie", "b=2")]),
            of(&[("cookie", "a=1b=2")])
        );
        // The value is nowhere in the key.
        assert!(!hex::encode(c).contains(&hex::encode("abc")));
    }

    #[test]
    fn only_the_callers_headers_are_asked_with() {
        let config = crate::config::Config::parse(
            "g.yaml",
            b"upstream: http://127.0.0.1:9\nidentity: { introspect: { path: /who?x=1, user: { header: X-User } } }\n",
        )
        .unwrap();
        let crate::config::IdentitySource::Introspect(i) = &config.identity.source else {
            panic!("an introspect source");
        };
        let ask = Introspector::new(i, &config.upstream);
        let (parts, ()) = Request::post("/payments")
            .header("cookie", "a=1")
            .header("cookie", "b=2")
            .header("authorization", "Bearer t")
            .header("host", "shop.example")
            .header("x-forwarded-for", "192.0.2.1")
            .header("content-type", "application/json")
            .header("idempotency-key", "k1")
            .body(())
            .unwrap()
            .into_parts();
        let req = ask.request(&parts, true);
        assert_eq!(req.method(), http::Method::GET);
        assert_eq!(req.uri(), "/who?x=1");
        let mut names: Vec<&str> = req.headers().keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            ["authorization", "cookie", "host", "x-forwarded-for"]
        );
        assert_eq!(req.headers()["cookie"], "a=1; b=2");
        // An untrusted peer's forwarding headers are not passed on; an
        // HTTP/2 request's authority is the Host.
        let (parts, ()) = Request::get("https://shop.example/payments")
            .header("cookie", "a=1")
            .header("x-forwarded-for", "192.0.2.1")
            .body(())
            .unwrap()
            .into_parts();
        let req = ask.request(&parts, false);
        assert_eq!(req.headers().get("x-forwarded-for"), None);
        assert_eq!(req.headers()["host"], "shop.example");
    }
}
