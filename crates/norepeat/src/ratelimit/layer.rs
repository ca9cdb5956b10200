//! [`RateLimitLayer`]: one or more quotas in front of a service, each with its key extractor.

use super::key::ExtractKey;
use super::limiter::RateLimiter;
use super::service::RateLimit;
use std::sync::Arc;
use tower::Layer;

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

pub(crate) struct Config<G> {
    pub(crate) rules: Vec<Rule<G>>,
    pub(crate) headers_on_allowed: bool,
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
#[must_use]
pub struct RateLimitLayer<G> {
    cfg: Config<G>,
}

impl<G: Clone> Clone for RateLimitLayer<G> {
    fn clone(&self) -> Self {
        Self {
            cfg: Config {
                rules: self.cfg.rules.clone(),
                headers_on_allowed: self.cfg.headers_on_allowed,
            },
        }
    }
}

impl<G> std::fmt::Debug for RateLimitLayer<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("quotas", &self.cfg.rules.len())
            .field("headers_on_allowed", &self.cfg.headers_on_allowed)
            .finish_non_exhaustive()
    }
}

impl<G> RateLimitLayer<G> {
    /// Limits with `limiter`, counting each request under the key `key`
    /// picks.
    pub fn new(limiter: RateLimiter<G>, key: impl ExtractKey) -> Self {
        Self {
            cfg: Config {
                rules: vec![Rule {
                    limiter,
                    key: Arc::new(key),
                }],
                headers_on_allowed: false,
            },
        }
    }

    /// Adds a quota that must admit the request too (asked after the ones
    /// before it).
    pub fn and(mut self, limiter: RateLimiter<G>, key: impl ExtractKey) -> Self {
        self.cfg.rules.push(Rule {
            limiter,
            key: Arc::new(key),
        });
        self
    }

    /// Also sends `RateLimit` and `RateLimit-Policy` on admitted responses
    /// (default: only on 429s).
    pub fn headers_on_allowed(mut self, yes: bool) -> Self {
        self.cfg.headers_on_allowed = yes;
        self
    }
}

impl<S, G: Clone> Layer<S> for RateLimitLayer<G> {
    type Service = RateLimit<S, G>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, Arc::new(self.clone().cfg))
    }
}
