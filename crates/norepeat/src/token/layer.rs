// Over 400 lines on purpose: the token layer and where a token is read from (header, query, form field), with the tests of each.
//! The token guard as a tower layer: [`TokenLayer`], the [`Token`] service
//! it builds, and its answers.

use super::guard::Used;
use super::{TokenGuard, TokenGuardError};
use crate::body::{self, BodyError};
use crate::identity::{Identify, UserHeader};
use crate::middleware::{
    GUARD_UNAVAILABLE, Handle, Middleware, ResponseBody, decided_locally, failed_open, mark,
    reject, shadowed, unauthenticated, would,
};
use crate::problem::{Code, Problem};
use crate::store::Store;
use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use http_body_util::Either;
use std::borrow::Cow;
use std::sync::Arc;
use tower::{Layer, Service};
use tracing::Instrument;

/// A service guarded by a [`TokenLayer`].
pub type Token<S, G> = Middleware<TokenLayer<G>, S>;

/// Put into a response's extensions by a service that never reached the
/// request's effect (a proxy whose upstream could not be reached: nothing
/// was sent): the [`TokenLayer`] then gives the token's use back, so the
/// client's retry with the same token goes through.
///
/// ```
/// use axum::{Router, body::Body, response::IntoResponse, routing::post};
/// use http::{Request, StatusCode};
/// use norepeat::store::MemoryStore;
/// use norepeat::token::{NotReached, TokenGuard, TokenLayer, TokenSigner};
/// use tower::ServiceExt;
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let tokens = TokenGuard::new(MemoryStore::default(), TokenSigner::random());
/// let token = tokens.issue("u1").token;
/// let down = || async {
///     let mut res = StatusCode::BAD_GATEWAY.into_response();
///     res.extensions_mut().insert(NotReached);
///     res
/// };
/// let app: Router = Router::new().route("/orders", post(down).layer(TokenLayer::new(tokens)));
/// let order = || Request::post("/orders")
///     .header("x-user-id", "u1")
///     .header("repeat-token", &token)
///     .body(Body::empty())
///     .unwrap();
/// assert_eq!(app.clone().oneshot(order()).await.unwrap().status(), 502);
/// // The token was given back: the retry reaches the service again.
/// assert_eq!(app.oneshot(order()).await.unwrap().status(), 502);
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotReached;

/// The default `detail` of 400 `missing_token`.
const MISSING_TOKEN: &str =
    "Send a repeat token in the Repeat-Token header or the repeatToken query parameter.";

/// The default `detail` of 400 `missing_token` with
/// [`form_field`](TokenLayer::form_field).
const MISSING_TOKEN_FORM: &str = "Send a repeat token in the Repeat-Token header, the repeatToken query parameter or a repeatToken form field.";

/// Guards a service with one-time tokens.
///
/// The request must carry a token in header `Repeat-Token` or query
/// parameter `repeatToken` (else 400 `missing_token`); a used, expired,
/// unknown or foreign one gets 409 `duplicate_submission` (an expired one
/// 409 `token_expired`), and a store
/// failure on a fail-closed guard 503 `guard_unavailable`. It needs a caller
/// (401 `unauthenticated` without one), taken from `X-User-Id` unless you set
/// another [`Identify`]. The body is not read, unless
/// [`form_field`](Self::form_field) asks for the token in a form's fields.
///
/// ```
/// use axum::{Router, routing::post};
/// use norepeat::store::MemoryStore;
/// use norepeat::token::{TokenGuard, TokenLayer, TokenSigner};
///
/// let tokens = TokenGuard::new(MemoryStore::default(), TokenSigner::random());
/// let app: Router = Router::new()
///     .route("/orders", post(|| async { "ok" }).layer(TokenLayer::new(tokens)));
/// ```
///
/// # Shadow mode
/// With [`shadow(true)`](Self::shadow) every token is checked and consumed
/// as above, and every request reaches the handler: see
/// [`shadow`](Self::shadow).
#[derive(Clone)]
#[must_use]
pub struct TokenLayer<G> {
    guard: TokenGuard<G>,
    identity: Arc<dyn Identify>,
    missing_token: Cow<'static, str>,
    route: Option<Cow<'static, str>>,
    shadow: bool,
    /// `form_field`: the largest form body read for a token.
    form: Option<usize>,
}

impl<G> std::fmt::Debug for TokenLayer<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenLayer")
            .field("missing_token", &self.missing_token)
            .field("route", &self.route)
            .field("shadow", &self.shadow)
            .field("form", &self.form)
            .finish_non_exhaustive()
    }
}

impl<G> TokenLayer<G> {
    /// Guards with `guard`, the caller from `X-User-Id`.
    pub fn new(guard: TokenGuard<G>) -> Self {
        Self {
            guard,
            identity: Arc::new(UserHeader::default()),
            missing_token: Cow::Borrowed(MISSING_TOKEN),
            route: None,
            shadow: false,
            form: None,
        }
    }

    /// Also takes the token from a `repeatToken` field of an
    /// `application/x-www-form-urlencoded` body (a plain HTML form, which
    /// can set no header), read up to `max_body` bytes (else 413
    /// `payload_too_large`) and handed on to the service byte for byte. The
    /// header and the query parameter come first: a request that carries
    /// either, or whose body is not a form, is not read (default: off).
    ///
    /// ```
    /// use axum::{Router, body::{Body, Bytes}, routing::post};
    /// use http::{Request, StatusCode};
    /// use norepeat::store::MemoryStore;
    /// use norepeat::token::{TokenGuard, TokenLayer, TokenSigner};
    /// use tower::ServiceExt;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let tokens = TokenGuard::new(MemoryStore::default(), TokenSigner::random());
    /// let token = tokens.issue("u1").token;
    /// let app: Router = Router::new().route(
    ///     "/orders",
    ///     post(|body: Bytes| async move { body }).layer(TokenLayer::new(tokens).form_field(64 * 1024)),
    /// );
    /// let form = format!("sku=a1&repeatToken={token}&note=gift+wrap");
    /// let order = || Request::post("/orders")
    ///     .header("x-user-id", "u1")
    ///     .header("content-type", "application/x-www-form-urlencoded")
    ///     .body(Body::from(form.clone()))
    ///     .unwrap();
    /// let res = app.clone().oneshot(order()).await.unwrap();
    /// assert_eq!(res.status(), StatusCode::OK);
    /// let echoed = axum::body::to_bytes(res.into_body(), usize::MAX).await.unwrap();
    /// assert_eq!(echoed, form.as_bytes(), "the service reads the body as it was sent");
    /// // The same form again: its token is spent.
    /// assert_eq!(app.oneshot(order()).await.unwrap().status(), StatusCode::CONFLICT);
    /// # }
    /// ```
    pub fn form_field(mut self, max_body: usize) -> Self {
        self.form = Some(max_body);
        if self.missing_token == MISSING_TOKEN {
            self.missing_token = Cow::Borrowed(MISSING_TOKEN_FORM);
        }
        self
    }

    /// The route template (`/orders/{id}`), a label for shadow mode's log
    /// lines only (default: the path the client sent).
    pub fn route(mut self, template: impl Into<Cow<'static, str>>) -> Self {
        self.route = Some(template.into());
        self
    }

    /// Shadow mode (default off): decide, count and log, never refuse.
    ///
    /// Every token is verified and consumed as it would be (its one use
    /// recorded in the store), so a token spent in shadow mode is spent for
    /// good. But a request the layer would refuse reaches the handler
    /// anyway, and is counted in `norepeat_shadow_total{guard="token",
    /// would}` and logged at `info` (guard, would, route, the caller's
    /// hash):
    ///
    /// | would refuse with | `would` |
    /// |---|---|
    /// | 409 `duplicate_submission` (a used, expired, unknown or foreign token) | `duplicate` |
    /// | 400 `missing_token` | `missing_token` |
    /// | 401 `unauthenticated` (no caller; the token is not looked at) | `unauthenticated` |
    /// | 503 `guard_unavailable` (the store failed, fail-closed) | `unavailable` |
    ///
    /// `missing_token` is the count to watch before switching it on: the
    /// clients that do not send tokens yet. A fail-open guard whose store
    /// fails lets the request through in either mode and counts nothing
    /// here. The store holds what it would hold without shadow mode, so
    /// turning shadow off refuses the requests shadow mode counted.
    ///
    /// The decision also goes into the response's extensions, as an entry
    /// of its [`ShadowedBy`](crate::shadow::ShadowedBy), for code outside
    /// the layer to read (a gateway counting by route).
    ///
    /// ```
    /// use axum::{Router, body::Body, routing::post};
    /// use http::{Request, StatusCode};
    /// use norepeat::store::MemoryStore;
    /// use norepeat::token::{TokenGuard, TokenLayer, TokenSigner};
    /// use tower::ServiceExt;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let tokens = TokenGuard::new(MemoryStore::default(), TokenSigner::random());
    /// let token = tokens.issue("u1").token;
    /// let app: Router = Router::new().route(
    ///     "/orders",
    ///     post(|| async { StatusCode::CREATED })
    ///         .layer(TokenLayer::new(tokens).route("/orders").shadow(true)),
    /// );
    /// let order = |token: &str| {
    ///     Request::post("/orders")
    ///         .header("x-user-id", "u1")
    ///         .header("repeat-token", token)
    ///         .body(Body::empty())
    ///         .unwrap()
    /// };
    /// assert_eq!(app.clone().oneshot(order(&token)).await.unwrap().status(), StatusCode::CREATED);
    /// // The token is spent: counted (would="duplicate") and logged, but it passes.
    /// assert_eq!(app.oneshot(order(&token)).await.unwrap().status(), StatusCode::CREATED);
    /// # }
    /// ```
    pub fn shadow(mut self, on: bool) -> Self {
        self.shadow = on;
        self
    }

    /// Where the caller's id comes from.
    pub fn identity(mut self, identity: impl Identify) -> Self {
        self.identity = Arc::new(identity);
        self
    }

    /// The `detail` of 400 `missing_token`: say where the client gets a
    /// token (default: "Send a repeat token in the Repeat-Token header or
    /// the repeatToken query parameter.").
    pub fn missing_token_detail(mut self, detail: impl Into<Cow<'static, str>>) -> Self {
        self.missing_token = detail.into();
        self
    }
}

impl<S, G: Clone> Layer<S> for TokenLayer<G> {
    type Service = Token<S, G>;

    fn layer(&self, inner: S) -> Self::Service {
        Middleware::new(inner, self.clone())
    }
}

impl<S, G, ReqBody, ResBody> Handle<S, ReqBody, ResBody> for TokenLayer<G>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    G: Store + Clone,
    ReqBody: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqBody::Error: std::error::Error + Send + Sync + 'static,
    ResBody: Send + 'static,
{
    type Body = ResponseBody<ResBody>;

    async fn handle(
        self: Arc<Self>,
        mut inner: S,
        req: Request<ReqBody>,
    ) -> Result<Response<Self::Body>, S::Error> {
        let (parts, mut body) = req.into_parts();
        let user = self.identity.identify(&parts);
        let mut token = token_of(&parts);
        let mut unread = None;
        if let (Some(max), Some(_), None) = (self.form, &user, &token)
            && is_form(&parts.headers)
        {
            if body::declares_over(&parts.headers, max) {
                // Refused before a byte is read: shadow mode hands it on whole.
                unread = Some(Problem::from(BodyError::TooLarge { max }));
            } else {
                match body::read(body, max, &parts.headers).await {
                    Ok(bytes) => {
                        token = form_token(&bytes);
                        body = ReqBody::from(bytes);
                    }
                    // Nothing is left to hand on, in shadow mode or not.
                    Err(e) => return Ok(reject(&Problem::from(e))),
                }
            }
        }
        let (user, refused, used) = match unread {
            Some(p) => (user, Some(p), Decided::Refused),
            None => self.decide(user, token).await,
        };
        let mut shadow = None;
        if let Some(p) = refused {
            if !self.shadow {
                return Ok(reject(&p));
            }
            let route = (self.route.as_deref()).unwrap_or(crate::request::client_path(&parts));
            shadow = Some(shadowed("token", would(p.code), route, user.as_deref()));
        }
        let req = Request::from_parts(parts, body);
        let mut res = inner.call(req).await?.map(Either::Left);
        match used {
            Decided::Recorded(used) if res.extensions().get::<NotReached>().is_some() => {
                self.guard.give_back(&used).await;
            }
            Decided::Recorded(used) if used.local => res = decided_locally(res, "token"),
            Decided::Recorded(_) | Decided::Refused => {}
            Decided::Open => res = failed_open(res, "token"),
        }
        Ok(match shadow {
            Some(s) => mark(res, s),
            None => res,
        })
    }
}

impl<G: Store + Clone> TokenLayer<G> {
    /// The caller, what the layer would refuse the request with (`None`: it
    /// passes), and the use it recorded (or that it passes undecided: the
    /// store failed, fail-open). The same steps and store operations in
    /// shadow mode or not.
    async fn decide(
        &self,
        user: Option<String>,
        token: Option<String>,
    ) -> (Option<String>, Option<Problem>, Decided) {
        let Some(user) = user else {
            return (
                None,
                Some(unauthenticated(&*self.identity)),
                Decided::Refused,
            );
        };
        let Some(token) = token else {
            let p = Problem::new(Code::MissingToken).detail(self.missing_token.clone());
            return (Some(user), Some(p), Decided::Refused);
        };
        let decision = self
            .guard
            .consume_decided(&user, &token)
            .instrument(tracing::debug_span!(
                "norepeat.decide",
                mode = "token",
                user
            ));
        match decision.await {
            Ok(Some(used)) => (Some(user), None, Decided::Recorded(used)),
            Ok(None) => (Some(user), None, Decided::Open),
            Err(e) => (Some(user), Some(Problem::from(e)), Decided::Refused),
        }
    }
}

/// What became of a request's token.
enum Decided {
    /// Its use is recorded.
    Recorded(Used),
    /// The store failed: let through fail-open, nothing recorded.
    Open,
    /// Refused (or counted so, in shadow mode): nothing recorded.
    Refused,
}

/// The token from `Repeat-Token`, else from `repeatToken` in the query.
/// A header that is not visible ASCII is kept as an (invalid) token so the
/// answer is 409, not "missing".
fn token_of(parts: &Parts) -> Option<String> {
    if let Some(v) = parts.headers.get("repeat-token") {
        return Some(String::from_utf8_lossy(v.as_bytes()).into_owned());
    }
    parts.uri.query()?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == "repeatToken").then(|| v.to_owned())
    })
}

/// The token a request presents, wherever [`TokenLayer`] with
/// [`form_field`](TokenLayer::form_field) looks: `Repeat-Token`, the
/// `repeatToken` query parameter, or a `repeatToken` field of a form
/// `body`. For keying something else by it (a stored answer replayed to a
/// second click).
///
/// ```
/// let req = http::Request::post("/orders?repeatToken=t1").body(()).unwrap();
/// let (head, ()) = req.into_parts();
/// assert_eq!(norepeat::token::presented(&head, b"").as_deref(), Some("t1"));
/// ```
#[must_use]
pub fn presented(parts: &Parts, body: &[u8]) -> Option<String> {
    token_of(parts).or_else(|| is_form(&parts.headers).then(|| form_token(body)).flatten())
}

/// Whether the body is a form (`application/x-www-form-urlencoded`,
/// parameters allowed).
fn is_form(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|e| {
            e.trim()
                .eq_ignore_ascii_case("application/x-www-form-urlencoded")
        })
}

/// The first `repeatToken` field of a form body, decoded.
fn form_token(body: &[u8]) -> Option<String> {
    form_urlencoded::parse(body)
        .find(|(k, _)| k == "repeatToken")
        .map(|(_, v)| v.into_owned())
}

impl From<TokenGuardError> for Problem {
    fn from(e: TokenGuardError) -> Self {
        let duplicate =
            |detail: &'static str| Problem::new(Code::DuplicateSubmission).detail(detail);
        match e {
            TokenGuardError::Used => {
                duplicate("This form was already submitted. Reload to get a new token.")
            }
            TokenGuardError::Expired => Problem::new(Code::TokenExpired)
                .detail("The repeat token expired. Reload to get a new one."),
            TokenGuardError::Invalid => {
                duplicate("The repeat token is unknown or belongs to another user.")
            }
            TokenGuardError::Unavailable(_) => Problem::new(Code::GuardUnavailable)
                .detail(GUARD_UNAVAILABLE)
                .retry_after_secs(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_form_names_its_token_in_any_spelling_of_the_field() {
        assert_eq!(
            form_token(b"a=1&repeatToken=t.k-1&b=2").as_deref(),
            Some("t.k-1")
        );
        assert_eq!(form_token(b"repeatToken=a%2Bb+c").as_deref(), Some("a+b c"));
        assert_eq!(form_token(b"repeattoken=x&RepeatToken=y"), None);
        assert_eq!(form_token(b""), None);
        let mut h = http::HeaderMap::new();
        assert!(!is_form(&h));
        h.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("Application/X-WWW-Form-Urlencoded; charset=UTF-8"),
        );
        assert!(is_form(&h));
        h.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("multipart/form-data; boundary=x"),
        );
        assert!(!is_form(&h));
    }
}
