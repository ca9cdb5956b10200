//! What a request met: the [`Verdict`] of every quota of a route, and the
//! `RateLimit` headers it makes (its 429 answer is made by the layer).

use crate::ratelimit::Quota;
use crate::store::RateDecision;
use http::{HeaderName, HeaderValue};
use std::borrow::Cow;
use std::fmt::Write as _;
use std::time::Duration;

/// The `RateLimit` header of the IETF httpapi draft.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// The `RateLimit-Policy` header of the IETF httpapi draft.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

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
    /// Whether the decision was the local memory's, the store having
    /// failed (a [`Fallback`](crate::store::Fallback)).
    pub decided_locally: bool,
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
}

fn sep(out: &mut String) {
    if !out.is_empty() {
        out.push_str(", ");
    }
}

/// Whole seconds, rounded up, at least 1.
pub(super) fn whole_secs(d: Duration) -> u64 {
    (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_seconds_round_up() {
        assert_eq!(whole_secs(Duration::ZERO), 1);
        assert_eq!(whole_secs(Duration::from_millis(1)), 1);
        assert_eq!(whole_secs(Duration::from_millis(1001)), 2);
        assert_eq!(whole_secs(Duration::from_secs(60)), 60);
    }
}
