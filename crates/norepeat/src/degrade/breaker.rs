//! A circuit breaker: closed, open, half-open.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go to the store.
    Closed,
    /// Calls are refused without asking the store.
    Open,
    /// One probe is under way.
    HalfOpen,
}

#[derive(Debug)]
struct Inner {
    state: BreakerState,
    failures: u32,
    opened_at: Instant,
}

/// Opens after `threshold` consecutive failures; after `cool_down` lets a
/// single probe through; closes when a probe succeeds, opens again when it
/// fails. Logs one error line when it opens and one when it closes.
///
/// ```
/// use norepeat::degrade::{Breaker, BreakerState};
/// use std::time::Duration;
/// let b = Breaker::new(2, Duration::from_secs(60));
/// assert!(b.allow());
/// b.record(false);
/// b.record(false);
/// assert_eq!(b.state(), BreakerState::Open);
/// assert!(!b.allow());
/// ```
#[derive(Debug)]
pub struct Breaker {
    inner: Mutex<Inner>,
    threshold: u32,
    cool_down: Duration,
    name: &'static str,
}

impl Breaker {
    /// A closed breaker.
    #[must_use]
    pub fn new(threshold: u32, cool_down: Duration) -> Self {
        Self {
            inner: Mutex::new(Inner {
                state: BreakerState::Closed,
                failures: 0,
                opened_at: Instant::now(),
            }),
            threshold: threshold.max(1),
            cool_down,
            name: "store",
        }
    }

    /// Names the breaker in logs and metrics.
    #[must_use]
    pub fn named(mut self, name: &'static str) -> Self {
        self.name = name;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave the state invalid
        // (every field is written atomically), so recover from poisoning.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The current state.
    #[must_use]
    pub fn state(&self) -> BreakerState {
        self.lock().state
    }

    /// Whether a call may go to the store now. In the open state, the first
    /// caller after the cool-down becomes the probe.
    #[must_use]
    pub fn allow(&self) -> bool {
        let mut g = self.lock();
        match g.state {
            BreakerState::Closed => true,
            BreakerState::HalfOpen => false,
            BreakerState::Open if g.opened_at.elapsed() >= self.cool_down => {
                g.state = BreakerState::HalfOpen;
                true
            }
            BreakerState::Open => false,
        }
    }

    /// Records the outcome of a call that [`allow`](Self::allow) let through.
    pub fn record(&self, ok: bool) {
        let mut g = self.lock();
        match (g.state, ok) {
            (BreakerState::Closed, true) => g.failures = 0,
            (BreakerState::Closed, false) => {
                g.failures += 1;
                if g.failures >= self.threshold {
                    self.open(&mut g);
                }
            }
            (BreakerState::HalfOpen, true) => {
                g.state = BreakerState::Closed;
                g.failures = 0;
                tracing::error!(
                    breaker = self.name,
                    "circuit breaker closed: store answers again"
                );
                metrics::gauge!("norepeat_breaker_open", "breaker" => self.name).set(0.0);
            }
            (BreakerState::HalfOpen, false) => self.open(&mut g),
            // A call let through before the breaker opened: already counted.
            (BreakerState::Open, _) => {}
        }
    }

    fn open(&self, g: &mut Inner) {
        if g.state != BreakerState::HalfOpen {
            tracing::error!(
                breaker = self.name,
                failures = g.failures,
                "circuit breaker opened: store calls skipped, routes use their failure policy"
            );
            metrics::counter!("norepeat_breaker_opened_total", "breaker" => self.name).increment(1);
        }
        g.state = BreakerState::Open;
        g.opened_at = Instant::now();
        metrics::gauge!("norepeat_breaker_open", "breaker" => self.name).set(1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_probes_once_and_closes() {
        let b = Breaker::new(3, Duration::ZERO);
        b.record(false);
        b.record(false);
        assert_eq!(b.state(), BreakerState::Closed);
        b.record(false);
        assert_eq!(b.state(), BreakerState::Open);
        assert!(b.allow(), "cool-down of zero: the next call probes");
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert!(!b.allow(), "only one probe at a time");
        b.record(true);
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn a_failed_probe_opens_again() {
        let b = Breaker::new(1, Duration::ZERO);
        b.record(false);
        assert!(b.allow());
        b.record(false);
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn open_breaker_waits_for_its_cool_down() {
        let b = Breaker::new(1, Duration::from_secs(3600));
        b.record(false);
        assert!(!b.allow());
        assert_eq!(b.state(), BreakerState::Open);
    }
}
