//! The limiter: a named quota, an algorithm, a store and a failure policy;
//! [`check_all`] asks several, and says why it could not decide
//! ([`RateLimitError`]).

use super::verdict::{Checked, Verdict};
use super::{Algorithm, Quota};
use crate::degrade::{FailurePolicy, on_store_error};
use crate::keys::{KeyBuilder, Namespace};
use crate::store::{DecidedBy, RateOp};
use crate::store::{RateDecision, Store, StoreError};
use std::borrow::Cow;

/// Why [`check_all`] could not decide. A refusal over the rate is not an
/// error: it is a [`Verdict`] that is not [`allowed`](Verdict::allowed).
/// The layer answers it as a [`Problem`](crate::problem::Problem) (`From` is
/// in its `layer.rs`, at the HTTP edge).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RateLimitError {
    /// The store of policy `policy` failed and the limiter fails closed
    /// (503 `guard_unavailable`).
    #[error("the store of rate-limit policy \"{policy}\" is unavailable: {error}")]
    Unavailable {
        /// The limiter's name.
        policy: Cow<'static, str>,
        /// What the store said.
        #[source]
        error: StoreError,
    },
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
///   limiter a [`Fallback`](crate::store::Fallback) store: it answers
///   from a local [`MemoryStore`](crate::store::MemoryStore) whenever the
///   primary fails, so the store never reports a failure and each instance
///   enforces the whole quota on its own (N instances admit up to N times
///   the quota while Redis is away).
/// - `FailClosed` refuses with 503 `guard_unavailable` and `Retry-After: 1`.
#[derive(Debug, Clone)]
pub struct RateLimiter<S> {
    store: S,
    name: Cow<'static, str>,
    quota: Quota,
    algorithm: Algorithm,
    keys: KeyBuilder,
    failure: FailurePolicy,
}

impl<S: Store> RateLimiter<S> {
    /// A GCRA limiter named `default` that fails open.
    #[must_use]
    pub fn new(store: S, quota: Quota) -> Self {
        Self {
            store,
            name: Cow::Borrowed("default"),
            quota,
            algorithm: Algorithm::default(),
            keys: KeyBuilder::default(),
            failure: FailurePolicy::FailOpen,
        }
    }

    /// The policy's name: it scopes the store keys (two limiters with
    /// different names never share a count) and names the policy in the
    /// `RateLimit` headers. Characters other than letters, digits and
    /// `-_.:/` are replaced by `_`.
    #[must_use]
    pub fn name(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        self.name = sanitize(name.into());
        self
    }

    /// The algorithm (default [`Algorithm::Gcra`]).
    #[must_use]
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// The key prefix and layout.
    #[must_use]
    pub fn keys(mut self, keys: KeyBuilder) -> Self {
        self.keys = keys;
        self
    }

    /// What to do when the store fails (default `FailOpen`).
    #[must_use]
    pub fn on_store_failure(mut self, policy: FailurePolicy) -> Self {
        self.failure = policy;
        self
    }

    /// The policy's name (set with [`name`](Self::name)).
    #[must_use]
    pub fn get_name(&self) -> &str {
        &self.name
    }

    /// The quota (given to [`new`](Self::new)).
    #[must_use]
    pub fn quota(&self) -> Quota {
        self.quota
    }

    /// The algorithm (set with [`algorithm`](Self::algorithm)).
    #[must_use]
    pub fn get_algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The failure policy (set with
    /// [`on_store_failure`](Self::on_store_failure)).
    #[must_use]
    pub fn get_on_store_failure(&self) -> FailurePolicy {
        self.failure
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
        let scale = match self.algorithm {
            Algorithm::FixedWindow | Algorithm::SlidingWindow => self.quota.period(),
            Algorithm::Gcra => self.quota.emission(),
        };
        let scale = scale.as_micros().to_string();
        self.keys.key(
            Namespace::RateLimit,
            &[
                self.name.as_bytes(),
                self.algorithm.letter(),
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
        Ok(self.check_decided(key).await?.0)
    }

    /// [`check`](Self::check), saying who decided: the store, or the local
    /// memory of one that failed.
    async fn check_decided(&self, key: &str) -> Result<(RateDecision, DecidedBy), StoreError> {
        let key = &self.store_key(key);
        let q = self.quota;
        let op = match self.algorithm {
            Algorithm::FixedWindow => RateOp::FixedWindow {
                key,
                limit: u64::from(q.max().get()),
                window: q.period(),
            },
            Algorithm::SlidingWindow => RateOp::SlidingWindow {
                key,
                limit: u64::from(q.max().get()),
                window: q.period(),
            },
            Algorithm::Gcra => RateOp::Gcra {
                key,
                emission: q.emission(),
                burst: u64::from(q.burst().get()),
            },
        };
        self.store.rate_decided(op).await
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
/// [`RateLimitError::Unavailable`] when a store fails under a limiter whose
/// policy is `FailClosed`. A fail-open limiter whose store fails is recorded
/// with no decision and admits.
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
pub async fn check_all<S: Store>(
    checks: &[(&RateLimiter<S>, &str)],
) -> Result<Verdict, RateLimitError> {
    let mut verdict = Verdict {
        checked: Vec::with_capacity(checks.len()),
        policies: checks
            .iter()
            .map(|(l, _)| (l.name.clone(), l.quota))
            .collect(),
    };
    for (limiter, key) in checks {
        let (decision, decided_locally) = match limiter.check_decided(key).await {
            Ok((d, by)) => (Some(d), by == DecidedBy::LocalMemory),
            Err(error) => {
                on_store_error("ratelimit", limiter.failure, error).map_err(|error| {
                    RateLimitError::Unavailable {
                        policy: limiter.name.clone(),
                        error,
                    }
                })?;
                (None, false)
            }
        };
        verdict.checked.push(Checked {
            policy: limiter.name.clone(),
            quota: limiter.quota,
            decision,
            decided_locally,
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
        assert!(!v.allowed());
        assert!(v.retry_after().is_some());
        assert_eq!(v.limit_header().unwrap(), "\"peruser\";r=0;t=60");
    }
}
