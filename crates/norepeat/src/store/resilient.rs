//! A store call with a time budget, behind a circuit breaker.

use super::{Breaker, KeyOp, KeyReply, KeyValueStore, RateDecision, RateOp, RateStore, StoreError};
use std::future::Future;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Wraps a store: every call gets a time budget and goes through a
/// [`Breaker`] (default: opens after 5 consecutive failures, probes after
/// 1 s). An error answer (`OOM`, `READONLY`, ...) counts as a failure,
/// exactly like a timeout; it is never taken for a decision.
///
/// # Slow is not down
/// The budget adapts to the store's observed latency: 3 times the p99 of the
/// last 100 calls, kept between a floor ([`timeout`](Self::timeout), default
/// 50 ms) and a ceiling ([`max_timeout`](Self::max_timeout), default 1 s).
/// A call that runs out of its budget records nothing then: silence does
/// not teach the budget. If its answer still comes (the store's
/// [`report_late_answers`](KeyValueStore::report_late_answers); the Redis
/// store does), it is recorded at the time it really took, so a store that
/// turns slow raises the budget within a few calls, and requests wait for
/// it instead of failing open. A store that hangs (accepts, never answers)
/// costs each request at most the budget it had before the hang, until
/// the breaker opens; a store that is down answers errors at once. The current budget
/// is [`budget`](Self::budget), and the gauge `norepeat_store_budget_ms`.
/// `timeout(d).max_timeout(d)` makes it fixed.
///
/// A probe of the half-open breaker that is cancelled (its future dropped)
/// or runs out of its budget counts as a failed probe.
///
/// Clones share the breaker and the budget.
///
/// ```
/// use norepeat::store::Resilient;
/// use norepeat::store::MemoryStore;
/// use std::time::Duration;
/// let store = Resilient::new(MemoryStore::default())
///     .timeout(Duration::from_millis(20))
///     .max_timeout(Duration::from_millis(500))
///     .breaker(3, Duration::from_millis(500));
/// assert_eq!(store.budget(), Duration::from_millis(20));
/// ```
#[derive(Clone)]
pub struct Resilient<S> {
    inner: S,
    budget: Arc<Budget>,
    breaker: Arc<Breaker>,
    /// Timeouts since the last answer; past [`RECONNECT_AFTER`] the store is
    /// asked to reconnect.
    timeouts: Arc<AtomicU32>,
    /// What the store reports late answers to (it holds this weakly): the
    /// budget's [`Budget::observe`].
    late: Arc<dyn Fn(Duration) + Send + Sync>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for Resilient<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resilient")
            .field("inner", &self.inner)
            .field("budget", &self.budget)
            .field("breaker", &self.breaker)
            .finish_non_exhaustive()
    }
}

/// Consecutive timed-out calls after which the store's connections are
/// replaced: a connection whose replies stopped coming never heals itself.
const RECONNECT_AFTER: u32 = 3;

/// The default floor of the budget.
const FLOOR: Duration = Duration::from_millis(50);
/// The default ceiling of the budget.
const CEILING: Duration = Duration::from_secs(1);
/// How many recent calls the p99 is taken over.
const SAMPLES: usize = 100;
/// How often, in calls, the p99 is computed again when nothing raises it.
const RECOMPUTE_EVERY: usize = 16;
/// The budget is this many times the recent p99.
const FACTOR: u32 = 3;

/// The adaptive time budget: recent latencies, and the budget they give.
#[derive(Debug)]
struct Budget {
    floor: Duration,
    ceiling: Duration,
    /// The current budget, in microseconds.
    current_us: AtomicU64,
    recent: Mutex<Recent>,
    store: &'static str,
}

#[derive(Debug)]
struct Recent {
    /// Latencies in microseconds, a ring.
    ring: [u32; SAMPLES],
    len: usize,
    next: usize,
}

impl Budget {
    fn new(floor: Duration, ceiling: Duration, store: &'static str) -> Self {
        let ceiling = ceiling.max(floor);
        let b = Self {
            floor,
            ceiling,
            current_us: AtomicU64::new(micros(floor)),
            recent: Mutex::new(Recent {
                ring: [0; SAMPLES],
                len: 0,
                next: 0,
            }),
            store,
        };
        b.export(floor);
        b
    }

    fn current(&self) -> Duration {
        Duration::from_micros(self.current_us.load(Ordering::Relaxed))
    }

    /// Takes in one call's latency and sets the budget to 3x the p99.
    ///
    /// The p99 is computed again at once when this call alone would raise
    /// the budget (a store turning slow is followed within a call or two),
    /// and otherwise every [`RECOMPUTE_EVERY`] calls (the budget comes back
    /// down), so the hot path of a healthy store records a sample and no
    /// more.
    fn observe(&self, took: Duration) {
        let raises = took.saturating_mul(FACTOR) > self.current();
        let p99 = {
            let mut r = self
                .recent
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let at = r.next;
            r.ring[at] = u32::try_from(took.as_micros()).unwrap_or(u32::MAX);
            r.next = (at + 1) % SAMPLES;
            r.len = (r.len + 1).min(SAMPLES);
            if !raises && !r.next.is_multiple_of(RECOMPUTE_EVERY) {
                return;
            }
            let mut sorted = r.ring;
            let n = r.len;
            let rank = (n * 99).div_ceil(100).max(1) - 1;
            *sorted[..n].select_nth_unstable(rank).1
        };
        let budget = Duration::from_micros(u64::from(p99))
            .saturating_mul(FACTOR)
            .clamp(self.floor, self.ceiling);
        let before = self.current_us.swap(micros(budget), Ordering::Relaxed);
        if before / 1_000 != micros(budget) / 1_000 {
            self.export(budget);
        }
    }

    fn export(&self, budget: Duration) {
        #[allow(clippy::cast_precision_loss)] // milliseconds below 2^52
        metrics::gauge!("norepeat_store_budget_ms", "store" => self.store)
            .set(budget.as_millis() as f64);
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl<S: KeyValueStore> Resilient<S> {
    /// `inner` with the default budget (adaptive, 50 ms to 1 s) and breaker.
    #[must_use]
    pub fn new(inner: S) -> Self {
        let kind = inner.kind();
        let budget = Arc::new(Budget::new(FLOOR, CEILING, kind));
        Self {
            late: late_to(&inner, &budget),
            inner,
            budget,
            breaker: Arc::new(Breaker::new(5, Duration::from_secs(1))),
            timeouts: Arc::new(AtomicU32::new(0)),
        }
        .breaker(5, Duration::from_secs(1))
    }

    /// Replaces the budget (and what late answers teach).
    fn with_budget(mut self, budget: Budget) -> Self {
        self.budget = Arc::new(budget);
        self.late = late_to(&self.inner, &self.budget);
        self
    }

    /// Sets the floor of the time budget (default 50 ms): the budget of a
    /// fast store, and where it starts.
    #[must_use]
    pub fn timeout(self, floor: Duration) -> Self {
        let budget = Budget::new(floor, self.budget.ceiling, self.inner.kind());
        let this = self.with_budget(budget);
        let (threshold, cool_down) = (this.breaker.threshold(), this.breaker.cool_down());
        this.breaker(threshold, cool_down)
    }

    /// Sets the ceiling of the time budget (default 1 s): the longest a call
    /// waits, however slow the store has been.
    #[must_use]
    pub fn max_timeout(self, ceiling: Duration) -> Self {
        let budget = Budget::new(self.budget.floor, ceiling, self.inner.kind());
        let this = self.with_budget(budget);
        let (threshold, cool_down) = (this.breaker.threshold(), this.breaker.cool_down());
        this.breaker(threshold, cool_down)
    }

    /// Replaces the breaker: opens after `threshold` consecutive failures,
    /// probes after `cool_down`.
    #[must_use]
    pub fn breaker(mut self, threshold: u32, cool_down: Duration) -> Self {
        // A probe reports just after its budget at the latest.
        let deadline = self.budget.ceiling.saturating_add(self.budget.ceiling / 10);
        self.breaker = Arc::new(Breaker::new(threshold, cool_down).probe_deadline(deadline));
        self
    }

    /// The breaker, to read its state.
    #[must_use]
    pub fn circuit(&self) -> &Breaker {
        &self.breaker
    }

    /// The current time budget of one call.
    #[must_use]
    pub fn budget(&self) -> Duration {
        self.budget.current()
    }

    /// The wrapped store.
    #[must_use]
    pub fn inner(&self) -> &S {
        &self.inner
    }

    async fn call<T>(
        &self,
        f: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        // Dropped before it reports (the caller gave up), a probe's permit
        // counts as a failed probe: the breaker never waits on it.
        let Some(permit) = self.breaker.permit() else {
            return Err(StoreError::CircuitOpen);
        };
        let budget = self.budget.current();
        let started = Instant::now();
        let result = match tokio::time::timeout(budget, f).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout(budget)),
        };
        let took = started.elapsed();
        // A timed-out call records nothing now: its answer, if it comes,
        // is recorded then (see `late`); a silent store teaches nothing.
        if !matches!(result, Err(StoreError::Timeout(_))) {
            self.budget.observe(took);
        }
        metrics::histogram!("norepeat_store_seconds", "store" => self.inner.kind())
            .record(took.as_secs_f64());
        if let Err(e) = &result {
            metrics::counter!("norepeat_store_errors_total", "store" => self.inner.kind(), "kind" => error_kind(e))
                .increment(1);
            tracing::debug!(error = %e, "store call failed");
        }
        permit.record(result.is_ok());
        match &result {
            Err(StoreError::Timeout(_)) => {
                if self.timeouts.fetch_add(1, Ordering::Relaxed) + 1 >= RECONNECT_AFTER {
                    self.timeouts.store(0, Ordering::Relaxed);
                    self.inner.reconnect();
                }
            }
            Ok(_) => self.timeouts.store(0, Ordering::Relaxed),
            Err(_) => {}
        }
        result
    }
}

fn error_kind(e: &StoreError) -> &'static str {
    match e {
        StoreError::Timeout(_) => "timeout",
        StoreError::CircuitOpen => "circuit_open",
        StoreError::Connection(_) => "connection",
        StoreError::Server(_) => "server",
        StoreError::Protocol(_) => "protocol",
        StoreError::InvalidUrl(_) => "invalid_url",
    }
}

impl<S: KeyValueStore> KeyValueStore for Resilient<S> {
    async fn execute(&self, op: KeyOp<'_>) -> Result<KeyReply, StoreError> {
        self.call(self.inner.execute(op)).await
    }
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn reconnect(&self) {
        self.inner.reconnect();
    }
    fn report_late_answers(&self, to: super::LateAnswers) {
        self.inner.report_late_answers(to);
    }
}

/// Asks `inner` to report its late answers to `budget`; the returned
/// target must be kept (the store holds it weakly).
fn late_to<S: KeyValueStore>(
    inner: &S,
    budget: &Arc<Budget>,
) -> Arc<dyn Fn(Duration) + Send + Sync> {
    let budget = Arc::clone(budget);
    let late: Arc<dyn Fn(Duration) + Send + Sync> = Arc::new(move |took| budget.observe(took));
    inner.report_late_answers(super::LateAnswers::new(&late));
    late
}

impl<S: RateStore> RateStore for Resilient<S> {
    async fn rate(&self, op: RateOp<'_>) -> Result<RateDecision, StoreError> {
        self.call(self.inner.rate(op)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A ceiling of `Duration::MAX` (no cap) does not overflow the
    /// breaker's probe deadline (before: a panic in `breaker`).
    #[test]
    fn the_longest_ceiling_saturates() {
        let store = Resilient::new(crate::store::MemoryStore::default())
            .max_timeout(Duration::MAX)
            .timeout(Duration::MAX);
        assert!(store.budget() > Duration::from_secs(1 << 40));
    }

    #[test]
    fn a_floor_above_the_ceiling_is_a_fixed_budget() {
        let b = Budget::new(2000 * MS, 1000 * MS, "test");
        assert_eq!(b.current(), 2000 * MS);
        for _ in 0..200 {
            b.observe(900 * MS);
        }
        assert_eq!(
            b.current(),
            2000 * MS,
            "3x 900 ms is capped by the fixed budget"
        );
    }

    #[test]
    fn the_budget_rises_at_once_and_comes_back_down() {
        let b = Budget::new(50 * MS, 1000 * MS, "test");
        for _ in 0..20 {
            b.observe(MS);
        }
        assert_eq!(b.current(), 50 * MS);
        // One slow call raises it right away (it is the p99 of so few).
        b.observe(80 * MS);
        assert_eq!(b.current(), 240 * MS);
        // A healthy store again: the slow sample leaves the window and the
        // budget returns to its floor.
        for _ in 0..SAMPLES + RECOMPUTE_EVERY {
            b.observe(MS);
        }
        assert_eq!(b.current(), 50 * MS);
    }
}
