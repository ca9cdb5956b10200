//! [`RateLimitLayer`]: one or more quotas in front of a service, each with
//! its key extractor; the [`RateLimit`] service it builds (extract the
//! keys, ask every quota, answer 429 or pass on), and its answers.

use super::key::{ExtractKey, MissingKey};
use super::limiter::{RateLimitError, RateLimiter, check_all};
use super::verdict::{Verdict, whole_secs};
use crate::middleware::{
    Handle, Middleware, ResponseBody, decided_locally, failed_open, mark, reject, shadowed, would,
};
use crate::problem::{Code, Problem};
use crate::store::Store;
use http::request::Parts;
use http::{Request, Response};
use http_body_util::Either;
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;
use tower::{Layer, Service};

/// A service limited by a [`RateLimitLayer`].
pub type RateLimit<S, G> = Middleware<RateLimitLayer<G>, S>;

pub(crate) struct Rule<G> {
    pub(crate) limiter: RateLimiter<G>,
    pub(crate) key: Arc<dyn ExtractKey>,
}

impl<G: Clone> Clone for Rule<G> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            key: Arc::clone(&self.key),
        }
    }
}

/// Limits the rate of a service with one or more quotas, each counted under
/// the key its [`ExtractKey`] picks from the request.
///
/// A request is admitted when every quota admits it (asked in the order
/// they were added; see [`check_all`](super::check_all) for why the
/// narrowest should come first). Otherwise the answer is 429
/// `rate_limited` (RFC 9457 problem+json) with `Retry-After` in whole
/// seconds (at least 1) and the `RateLimit` and `RateLimit-Policy` headers;
/// the [`Problem`](crate::problem::Problem) rides in the response's
/// extensions. A request without a key (no user, say) gets the extractor's
/// answer (401 for [`ByUser`](super::ByUser)) and is counted nowhere. A
/// failing store is handled by each limiter's
/// [`FailurePolicy`](crate::degrade::FailurePolicy).
///
/// ```
/// use axum::{Router, routing::post};
/// use norepeat::ratelimit::{ByUser, Global, Quota, RateLimitLayer, RateLimiter};
/// use norepeat::store::MemoryStore;
///
/// let store = MemoryStore::default();
/// let per_user = RateLimiter::new(store.clone(), Quota::parse("5/s").unwrap()).name("user");
/// let total = RateLimiter::new(store, Quota::parse("1000/s").unwrap()).name("all");
/// let app: Router = Router::new().route(
///     "/flash-sale/{sku}",
///     post(|| async { "ordered" }).layer(
///         RateLimitLayer::new(per_user, ByUser::default())
///             .and(total, Global)
///             .headers_on_allowed(true),
///     ),
/// );
/// ```
///
/// # Shadow mode
/// With [`shadow(true)`](Self::shadow) every quota is asked and spent as
/// above, and every request reaches the handler: see
/// [`shadow`](Self::shadow).
#[must_use]
pub struct RateLimitLayer<G> {
    rules: Vec<Rule<G>>,
    headers_on_allowed: bool,
    route: Option<Cow<'static, str>>,
    shadow: bool,
}

impl<G: Clone> Clone for RateLimitLayer<G> {
    fn clone(&self) -> Self {
        Self {
            rules: self.rules.clone(),
            headers_on_allowed: self.headers_on_allowed,
            route: self.route.clone(),
            shadow: self.shadow,
        }
    }
}

impl<G> std::fmt::Debug for RateLimitLayer<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("quotas", &self.rules.len())
            .field("headers_on_allowed", &self.headers_on_allowed)
            .field("route", &self.route)
            .field("shadow", &self.shadow)
            .finish_non_exhaustive()
    }
}

impl<G> RateLimitLayer<G> {
    /// Limits with `limiter`, counting each request under the key `key`
    /// picks.
    pub fn new(limiter: RateLimiter<G>, key: impl ExtractKey) -> Self {
        Self {
            rules: vec![Rule {
                limiter,
                key: Arc::new(key),
            }],
            headers_on_allowed: false,
            route: None,
            shadow: false,
        }
    }

    /// Adds a quota that must admit the request too (asked after the ones
    /// before it).
    pub fn and(mut self, limiter: RateLimiter<G>, key: impl ExtractKey) -> Self {
        self.rules.push(Rule {
            limiter,
            key: Arc::new(key),
        });
        self
    }

    /// Also sends `RateLimit` and `RateLimit-Policy` on admitted responses
    /// (default: only on 429s).
    pub fn headers_on_allowed(mut self, yes: bool) -> Self {
        self.headers_on_allowed = yes;
        self
    }

    /// The route template (`/flash-sale/{sku}`), a label for shadow mode's
    /// log lines only (default: the path the client sent).
    pub fn route(mut self, template: impl Into<Cow<'static, str>>) -> Self {
        self.route = Some(template.into());
        self
    }

    /// Shadow mode (default off): decide, count and log, never refuse
    /// (Envoy's rate limit `shadow_mode`).
    ///
    /// Every request is checked against every quota as it would be, and
    /// spends what it would spend (a refused request stops at the quota
    /// that refused it, as in [`check_all`](super::check_all)), so the
    /// counters are the ones an enforcing layer would keep. But a request
    /// the layer would refuse reaches the handler anyway, and is counted in
    /// `norepeat_shadow_total{guard="rate_limit", would}` and logged at
    /// `info` (guard, would, route, and as `user` the hash of the refusing
    /// quota's key, the caller for [`ByUser`](super::ByUser)):
    ///
    /// | would refuse with | `would` |
    /// |---|---|
    /// | 429 `rate_limited` | `rate_limited` |
    /// | 401 `unauthenticated` (no caller for a [`ByUser`](super::ByUser) quota; counted nowhere) | `unauthenticated` |
    /// | 400 `invalid_request` (another extractor found no key) | `invalid_request` |
    /// | 503 `guard_unavailable` (a fail-closed quota's store failed) | `unavailable` |
    ///
    /// A passed request's response carries its [`Verdict`] in its
    /// extensions, refused or not, and the `RateLimit` headers only with
    /// [`headers_on_allowed`](Self::headers_on_allowed). Turning shadow off
    /// refuses the requests shadow mode counted.
    ///
    /// The decision also goes into the response's extensions, as an entry
    /// of its [`ShadowedBy`](crate::shadow::ShadowedBy), for code outside
    /// the layer to read (a gateway counting by route).
    ///
    /// ```
    /// use axum::{Router, body::Body, routing::post};
    /// use http::{Request, StatusCode};
    /// use norepeat::ratelimit::{ByUser, Quota, RateLimitLayer, RateLimiter};
    /// use norepeat::store::MemoryStore;
    /// use tower::ServiceExt;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let per_user = RateLimiter::new(MemoryStore::default(), Quota::parse("1/m").unwrap());
    /// let app: Router = Router::new().route(
    ///     "/flash-sale/{sku}",
    ///     post(|| async { StatusCode::CREATED }).layer(
    ///         RateLimitLayer::new(per_user, ByUser::default())
    ///             .route("/flash-sale/{sku}")
    ///             .shadow(true),
    ///     ),
    /// );
    /// let buy = || {
    ///     Request::post("/flash-sale/sku-1").header("x-user-id", "u1").body(Body::empty()).unwrap()
    /// };
    /// assert_eq!(app.clone().oneshot(buy()).await.unwrap().status(), StatusCode::CREATED);
    /// // Over the quota: counted (would="rate_limited") and logged, but it passes.
    /// assert_eq!(app.oneshot(buy()).await.unwrap().status(), StatusCode::CREATED);
    /// # }
    /// ```
    pub fn shadow(mut self, on: bool) -> Self {
        self.shadow = on;
        self
    }
}

impl<S, G: Clone> Layer<S> for RateLimitLayer<G> {
    type Service = RateLimit<S, G>;

    fn layer(&self, inner: S) -> Self::Service {
        Middleware::new(inner, self.clone())
    }
}

impl<S, G, ReqBody, ResBody> Handle<S, ReqBody, ResBody> for RateLimitLayer<G>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    G: Store + Clone,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Body = ResponseBody<ResBody>;

    async fn handle(
        self: Arc<Self>,
        mut inner: S,
        req: Request<ReqBody>,
    ) -> Result<Response<Self::Body>, S::Error> {
        let (parts, body) = req.into_parts();
        let (verdict, refused) = self.decide(&parts).await;
        let mut shadow = None;
        if let Some((p, key)) = refused {
            if !self.shadow {
                return Ok(reject(&p));
            }
            let route = (self.route.as_deref()).unwrap_or(crate::request::client_path(&parts));
            shadow = Some(shadowed("rate_limit", would(p.code), route, key.as_deref()));
        }
        let mut res = inner
            .call(Request::from_parts(parts, body))
            .await?
            .map(Either::Left);
        if let Some(verdict) = verdict {
            // A quota whose store failed under a fail-open limiter was not
            // decided: the request got through without it.
            if verdict.checked.iter().any(|c| c.decision.is_none()) {
                res = failed_open(res, "rate_limit");
            } else if verdict.checked.iter().any(|c| c.decided_locally) {
                res = decided_locally(res, "rate_limit");
            }
            if self.headers_on_allowed {
                for (k, v) in verdict.headers() {
                    res.headers_mut().append(k, v);
                }
            }
            res.extensions_mut().insert(verdict);
        }
        Ok(match shadow {
            Some(s) => mark(res, s),
            None => res,
        })
    }
}

impl<G: Store + Clone> RateLimitLayer<G> {
    /// Every quota's verdict on a request (`None` when it was not asked),
    /// and what the layer would refuse it with, with the refusing quota's
    /// key. The same steps and store operations in shadow mode or not.
    async fn decide(&self, parts: &Parts) -> (Option<Verdict>, Option<(Problem, Option<String>)>) {
        // Every key first: a request without one is counted nowhere.
        let mut keys = Vec::with_capacity(self.rules.len());
        for rule in &self.rules {
            match rule.key.extract_key(parts) {
                Some(k) => keys.push(k),
                None => return (None, Some((Problem::from(rule.key.missing()), None))),
            }
        }
        let checks: Vec<(&RateLimiter<G>, &str)> = self
            .rules
            .iter()
            .zip(&keys)
            .map(|(r, k)| (&r.limiter, k.as_str()))
            .collect();
        let verdict = match check_all(&checks).await {
            Ok(v) => v,
            Err(e) => return (None, Some((Problem::from(e), None))),
        };
        let Some(p) = verdict.to_problem() else {
            return (Some(verdict), None);
        };
        tracing::debug!(path = crate::request::client_path(parts), "rate limited");
        // `check_all` stops at the quota that refused: the last one asked.
        // Moved out of `keys` (dropped here anyway), never copied.
        drop(checks);
        let key = keys
            .into_iter()
            .nth(verdict.checked.len().saturating_sub(1));
        (Some(verdict), Some((p, key)))
    }
}

impl Verdict {
    /// The 429 `rate_limited` answer with `Retry-After` and both headers,
    /// for a refused request.
    #[must_use]
    pub fn to_problem(&self) -> Option<Problem> {
        let refused = self.refused_by()?;
        let wait = refused.decision.map_or(Duration::from_secs(1), |d| d.reset);
        let mut p = Problem::new(Code::RateLimited)
            .detail(format!(
                "Over the rate of policy \"{}\" ({}); retry in {} s.",
                refused.policy,
                refused.quota,
                whole_secs(wait)
            ))
            .retry_after_secs(whole_secs(wait));
        for (k, v) in self.headers() {
            p = p.header(k, v);
        }
        Some(p)
    }
}

impl From<MissingKey> for Problem {
    fn from(m: MissingKey) -> Self {
        match m {
            MissingKey::Caller(detail) => Problem::new(Code::Unauthenticated).detail(detail),
            MissingKey::Other(detail) => Problem::new(Code::InvalidRequest).detail(detail),
        }
    }
}

impl From<RateLimitError> for Problem {
    fn from(e: RateLimitError) -> Self {
        match e {
            RateLimitError::Unavailable { .. } => Problem::new(Code::GuardUnavailable)
                .detail("The rate limiter cannot decide right now; retry shortly.")
                .retry_after_secs(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ratelimit::Quota;
    use crate::store::MemoryStore;
    use std::num::NonZeroU32;

    #[tokio::test]
    async fn a_refusal_is_429_with_the_wait() {
        let l = RateLimiter::new(
            MemoryStore::default(),
            Quota::per_minute(NonZeroU32::new(2).unwrap()),
        )
        .name("peruser")
        .algorithm(crate::ratelimit::Algorithm::FixedWindow);
        let v = check_all(&[(&l, "u")]).await.unwrap();
        assert!(v.to_problem().is_none());
        check_all(&[(&l, "u")]).await.unwrap();
        let v = check_all(&[(&l, "u")]).await.unwrap();
        let p = v.to_problem().unwrap();
        assert_eq!(p.code, Code::RateLimited);
        assert_eq!(p.retry_after, Some(60));
    }
}
