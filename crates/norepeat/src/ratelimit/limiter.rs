//! The limiter: a named quota, an algorithm, a store and a failure policy.

use super::{Algorithm, Quota};
use crate::degrade::FailurePolicy;
use crate::keys::{KeyBuilder, Mode};
use crate::problem::{Code, Problem};
use crate::store::RateStoreExt;
use crate::store::{RateDecision, Store, StoreError};
use http::{HeaderName, HeaderValue};
use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

/// The `RateLimit` header of the IETF httpapi draft.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// The `RateLimit-Policy` header of the IETF httpapi draft.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

#[derive(Debug)]
struct Config {
    name: Cow<'static, str>,
    quota: Quota,
    algorithm: Algorithm,
    keys: KeyBuilder,
    failure: FailurePolicy,
}

/// One quota, counted in a store under a key per caller (or per whatever
/// the key names).
///
/// Every decision is one atomic store operation, timed by the store's clock,
/// so instances sharing a Redis share one quota exactly.
///
/// ```
/// use norepeat::ratelimit::{Algorithm, Quota, RateLimiter};
/// use norepeat::store::MemoryStore;
/// use std::num::NonZeroU32;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), norepeat::store::StoreError> {
/// let limiter = RateLimiter::new(MemoryStore::default(), Quota::parse("2/s").expect("valid"))
///     .name("flash")
///     .algorithm(Algorithm::Gcra);
/// assert!(limiter.check("u1").await?.allowed);
/// assert!(limiter.check("u1").await?.allowed);
/// let third = limiter.check("u1").await?;
/// assert!(!third.allowed);
/// assert!(third.reset.as_millis() <= 500); // one more every 500 ms
/// assert!(limiter.check("u2").await?.allowed); // every key has its own quota
/// # Ok(()) }
/// ```
///
/// # When the store fails
/// [`check`](Self::check) returns the error; the layer and [`check_all`]
/// apply the limiter's [`FailurePolicy`]:
/// - `FailOpen` (default) admits the request as far as this quota goes.
///   To keep limiting *per instance* during an outage instead, give the
///   limiter a [`Fallback`](crate::degrade::Fallback) store: it answers
///   from a local [`MemoryStore`](crate::store::MemoryStore) whenever the
///   primary fails, so the store never reports a failure and each instance
///   enforces the whole quota on its own (N instances admit up to N times
///   the quota while Redis is away).
/// - `FailClosed` refuses with 503 `guard_unavailable` and `Retry-After: 1`.
#[derive(Debug)]
pub struct RateLimiter<S> {
    store: S,
    cfg: Arc<Config>,
}

impl<S: Clone> Clone for RateLimiter<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            cfg: Arc::clone(&self.cfg),
        }
    }
}

impl<S: Store> RateLimiter<S> {
    /// A GCRA limiter named `default` that fails open.
    #[must_use]
    pub fn new(store: S, quota: Quota) -> Self {
        Self {
            store,
            cfg: Arc::new(Config {
                name: Cow::Borrowed("default"),
                quota,
                algorithm: Algorithm::default(),
                keys: KeyBuilder::default(),
                failure: FailurePolicy::FailOpen,
            }),
        }
    }

    fn with(mut self, f: impl FnOnce(&mut Config)) -> Self {
        let mut cfg = Config {
            name: self.cfg.name.clone(),
            quota: self.cfg.quota,
            algorithm: self.cfg.algorithm,
            keys: self.cfg.keys.clone(),
            failure: self.cfg.failure,
        };
        f(&mut cfg);
        self.cfg = Arc::new(cfg);
        self
    }

    /// The policy's name: it scopes the store keys (two limiters with
    /// different names never share a count) and names the policy in the
    /// `RateLimit` headers. Characters other than letters, digits and
    /// `-_.:/` are replaced by `_`.
    #[must_use]
    pub fn name(self, name: impl Into<Cow<'static, str>>) -> Self {
        let name = sanitize(name.into());
        self.with(|c| c.name = name)
    }

    /// The algorithm (default [`Algorithm::Gcra`]).
    #[must_use]
    pub fn algorithm(self, algorithm: Algorithm) -> Self {
        self.with(|c| c.algorithm = algorithm)
    }

    /// The key prefix and layout.
    #[must_use]
    pub fn keys(self, keys: KeyBuilder) -> Self {
        self.with(|c| c.keys = keys)
    }

    /// What to do when the store fails (default `FailOpen`).
    #[must_use]
    pub fn on_store_failure(self, policy: FailurePolicy) -> Self {
        self.with(|c| c.failure = policy)
    }

    /// The policy's name.
    #[must_use]
    pub fn policy_name(&self) -> &str {
        &self.cfg.name
    }

    /// The quota.
    #[must_use]
    pub fn quota(&self) -> Quota {
        self.cfg.quota
    }

    /// The algorithm.
    #[must_use]
    pub fn algorithm_kind(&self) -> Algorithm {
        self.cfg.algorithm
    }

    /// The failure policy.
    #[must_use]
    pub fn failure_policy(&self) -> FailurePolicy {
        self.cfg.failure
    }

    /// The store.
    #[must_use]
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The store key `key` is counted under.
    ///
    /// It names the policy, the algorithm and the time scale its stored
    /// state is written in (the window, or GCRA's emission interval), so a
    /// quota changed between deployments (`5/s` to `100/m`) starts on fresh
    /// keys instead of reading counters it would misjudge. A change of the
    /// count alone (`5/s` to `10/s`) keeps the keys and the counts.
    #[must_use]
    pub fn store_key(&self, key: &str) -> String {
        let c = &self.cfg;
        let scale = match c.algorithm {
            Algorithm::FixedWindow | Algorithm::SlidingWindow => c.quota.period(),
            Algorithm::Gcra => c.quota.emission(),
        };
        let scale = scale.as_micros().to_string();
        c.keys.key(
            Mode::RateLimit,
            &[
                c.name.as_bytes(),
                c.algorithm.letter(),
                scale.as_bytes(),
                key.as_bytes(),
            ],
        )
    }

    /// Counts one request under `key` and says whether it is admitted.
    /// A refused request still counts in the fixed window (its counter is
    /// one `INCR`); the sliding window and GCRA count admitted requests
    /// only.
    ///
    /// # Errors
    /// When the store fails; no failure policy is applied here.
    pub async fn check(&self, key: &str) -> Result<RateDecision, StoreError> {
        let k = self.store_key(key);
        let q = self.cfg.quota;
        match self.cfg.algorithm {
            Algorithm::FixedWindow => {
                self.store
                    .fixed_window(&k, u64::from(q.max().get()), q.period())
                    .await
            }
            Algorithm::SlidingWindow => {
                self.store
                    .sliding_window(&k, u64::from(q.max().get()), q.period())
                    .await
            }
            Algorithm::Gcra => {
                self.store
                    .gcra(&k, q.emission(), u64::from(q.burst().get()))
                    .await
            }
        }
    }
}

/// Replaces what a structured-field string or a log line should not hold.
fn sanitize(name: Cow<'static, str>) -> Cow<'static, str> {
    let ok = |c: char| c.is_ascii_alphanumeric() || "-_.:/".contains(c);
    if !name.is_empty() && name.chars().all(ok) {
        name
    } else if name.is_empty() {
        Cow::Borrowed("default")
    } else {
        Cow::Owned(name.chars().map(|c| if ok(c) { c } else { '_' }).collect())
    }
}

/// One quota's part in a [`Verdict`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// The policy's name.
    pub policy: Cow<'static, str>,
    /// Its quota.
    pub quota: Quota,
    /// The store's decision; `None` when the store failed and the policy
    /// let the request through (fail-open).
    pub decision: Option<RateDecision>,
}

/// The outcome of one request against every quota of a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The quotas asked, in order, up to and including the one that
    /// refused the request.
    pub checked: Vec<Checked>,
    /// The quotas of the route, asked or not: `(name, quota)`.
    pub policies: Vec<(Cow<'static, str>, Quota)>,
}

impl Verdict {
    /// Whether every quota admitted the request.
    #[must_use]
    pub fn allowed(&self) -> bool {
        self.refused_by().is_none()
    }

    /// The quota that refused the request, if one did.
    #[must_use]
    pub fn refused_by(&self) -> Option<&Checked> {
        self.checked
            .iter()
            .find(|c| c.decision.is_some_and(|d| !d.allowed))
    }

    /// How long to wait before a retry can be admitted (for a refused
    /// request).
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        self.refused_by()?.decision.map(|d| d.reset)
    }

    /// `RateLimit-Policy`: every quota of the route, as
    /// `"name";q=MAX;w=SECONDS`.
    #[must_use]
    pub fn policy_header(&self) -> Option<HeaderValue> {
        let mut out = String::new();
        for (name, q) in &self.policies {
            sep(&mut out);
            let _ = write!(out, "\"{name}\";q={};w={}", q.max(), whole_secs(q.period()));
        }
        HeaderValue::from_str(&out).ok().filter(|_| !out.is_empty())
    }

    /// `RateLimit`: the quotas asked, as `"name";r=REMAINING;t=SECONDS`,
    /// where `t` is when the quota is whole again (when admitted) or when a
    /// request will be admitted again (when refused; then it equals
    /// `Retry-After`).
    #[must_use]
    pub fn limit_header(&self) -> Option<HeaderValue> {
        let mut out = String::new();
        for c in &self.checked {
            let Some(d) = c.decision else { continue };
            sep(&mut out);
            let _ = write!(
                out,
                "\"{}\";r={};t={}",
                c.policy,
                d.remaining,
                whole_secs(d.reset)
            );
        }
        HeaderValue::from_str(&out).ok().filter(|_| !out.is_empty())
    }

    /// Both headers, for a response.
    #[must_use]
    pub fn headers(&self) -> Vec<(HeaderName, HeaderValue)> {
        let mut h = Vec::with_capacity(2);
        if let Some(v) = self.limit_header() {
            h.push((RATELIMIT, v));
        }
        if let Some(v) = self.policy_header() {
            h.push((RATELIMIT_POLICY, v));
        }
        h
    }

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

fn sep(out: &mut String) {
    if !out.is_empty() {
        out.push_str(", ");
    }
}

/// Whole seconds, rounded up, at least 1.
fn whole_secs(d: Duration) -> u64 {
    (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1)
}

/// Asks every `(limiter, key)` in turn; all must admit. Stops at the first
/// refusal, so later quotas are not spent by a refused request.
///
/// # Quotas already spent
/// The check is not a transaction across quotas: a request refused by the
/// second quota was already counted by the first (one attempt of a window,
/// or one emission interval of GCRA). Order the quotas from the narrowest
/// (per user) to the broadest (global), so that a caller over their own
/// quota never spends the shared one, and a shared refusal costs a caller
/// at most their own attempt.
///
/// # Errors
/// A 503 `guard_unavailable` [`Problem`] when a store fails under a
/// limiter whose policy is `FailClosed`. A fail-open limiter whose store
/// fails is recorded with no decision and admits.
///
/// ```
/// use norepeat::ratelimit::{check_all, Quota, RateLimiter};
/// use norepeat::store::MemoryStore;
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store = MemoryStore::default();
/// let per_user = RateLimiter::new(store.clone(), Quota::parse("2/s").unwrap()).name("user");
/// let global = RateLimiter::new(store, Quota::parse("3/s").unwrap()).name("all");
/// let ask = |user| {
///     let (per_user, global) = (per_user.clone(), global.clone());
///     async move { check_all(&[(&per_user, user), (&global, "")]).await.unwrap().allowed() }
/// };
/// assert!(ask("u1").await && ask("u1").await);
/// assert!(!ask("u1").await); // u1's own quota: the global one is not spent
/// assert!(ask("u2").await);
/// assert!(!ask("u2").await); // the global quota (3/s) is spent
/// # }
/// ```
pub async fn check_all<S: Store>(checks: &[(&RateLimiter<S>, &str)]) -> Result<Verdict, Problem> {
    let mut verdict = Verdict {
        checked: Vec::with_capacity(checks.len()),
        policies: checks
            .iter()
            .map(|(l, _)| (l.cfg.name.clone(), l.cfg.quota))
            .collect(),
    };
    for (limiter, key) in checks {
        let decision = match limiter.check(key).await {
            Ok(d) => Some(d),
            Err(e) => {
                store_failure(&limiter.cfg.name, limiter.cfg.failure, &e)?;
                None
            }
        };
        verdict.checked.push(Checked {
            policy: limiter.cfg.name.clone(),
            quota: limiter.cfg.quota,
            decision,
        });
        if decision.is_some_and(|d| !d.allowed) {
            metrics::counter!("norepeat_decisions_total", "mode" => "ratelimit", "outcome" => "rejected", "reason" => "rate").increment(1);
            return Ok(verdict);
        }
    }
    metrics::counter!("norepeat_decisions_total", "mode" => "ratelimit", "outcome" => "admitted")
        .increment(1);
    Ok(verdict)
}

/// Applies a failure policy to a store error (the rate limiter's version of
/// the guards' helper).
fn store_failure(policy_name: &str, policy: FailurePolicy, e: &StoreError) -> Result<(), Problem> {
    match policy {
        FailurePolicy::FailOpen => {
            metrics::counter!("norepeat_decisions_total", "mode" => "ratelimit", "outcome" => "admitted_degraded").increment(1);
            tracing::warn!(policy = policy_name, error = %e, "rate limit store failed: admitting (fail-open)");
            Ok(())
        }
        FailurePolicy::FailClosed => {
            metrics::counter!("norepeat_decisions_total", "mode" => "ratelimit", "outcome" => "rejected", "reason" => "unavailable").increment(1);
            tracing::warn!(policy = policy_name, error = %e, "rate limit store failed: refusing (fail-closed)");
            Err(Problem::new(Code::GuardUnavailable)
                .detail("The rate limiter cannot decide right now; retry shortly.")
                .retry_after_secs(1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;
    use std::num::NonZeroU32;

    fn q(n: u32) -> Quota {
        Quota::per_minute(NonZeroU32::new(n).unwrap())
    }

    #[test]
    fn names_are_safe_in_headers() {
        assert_eq!(sanitize("flash-sale".into()), "flash-sale");
        assert_eq!(sanitize("a \"b\"\\".into()), "a__b__");
        assert_eq!(sanitize("".into()), "default");
    }

    #[test]
    fn keys_depend_on_name_algorithm_and_key() {
        let l = RateLimiter::new(MemoryStore::default(), q(1));
        let a = l.store_key("u1");
        assert_ne!(a, l.clone().name("other").store_key("u1"));
        assert_ne!(
            a,
            l.clone().algorithm(Algorithm::FixedWindow).store_key("u1")
        );
        assert_ne!(a, l.store_key("u2"));
        assert!(a.starts_with("nr:r"));
    }

    #[test]
    fn keys_depend_on_the_time_scale_not_the_count() {
        let key = |rate: &str, algorithm| {
            RateLimiter::new(MemoryStore::default(), Quota::parse(rate).unwrap())
                .algorithm(algorithm)
                .store_key("u1")
        };
        for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
            assert_ne!(key("5/s", algorithm), key("100/m", algorithm));
            assert_eq!(key("5/s", algorithm), key("10/s", algorithm));
        }
        assert_ne!(key("5/s", Algorithm::Gcra), key("10/s", Algorithm::Gcra));
        assert_eq!(key("1/s", Algorithm::Gcra), key("60/m", Algorithm::Gcra));
    }

    #[tokio::test]
    async fn headers_follow_the_draft() {
        let l = RateLimiter::new(MemoryStore::default(), q(2))
            .name("peruser")
            .algorithm(Algorithm::FixedWindow);
        let v = check_all(&[(&l, "u")]).await.unwrap();
        assert!(v.allowed());
        assert_eq!(v.policy_header().unwrap(), "\"peruser\";q=2;w=60");
        assert_eq!(v.limit_header().unwrap(), "\"peruser\";r=1;t=60");
        check_all(&[(&l, "u")]).await.unwrap();
        let v = check_all(&[(&l, "u")]).await.unwrap();
        let p = v.to_problem().unwrap();
        assert_eq!(p.code, Code::RateLimited);
        assert_eq!(p.retry_after, Some(60));
        assert_eq!(v.limit_header().unwrap(), "\"peruser\";r=0;t=60");
    }

    #[test]
    fn whole_seconds_round_up() {
        assert_eq!(whole_secs(Duration::ZERO), 1);
        assert_eq!(whole_secs(Duration::from_millis(1)), 1);
        assert_eq!(whole_secs(Duration::from_millis(1001)), 2);
        assert_eq!(whole_secs(Duration::from_secs(60)), 60);
    }
}
