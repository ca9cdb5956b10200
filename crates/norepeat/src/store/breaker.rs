// Over 400 lines on purpose: one breaker, its permit and its states read best together; its last 100 lines are unit tests.
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
    /// When the last failure counted was recorded: a call that started
    /// before it was in flight with it, and its failure is the same one.
    last_failure: Option<Instant>,
    opened_at: Instant,
    /// When the current probe was let through.
    probe_started: Instant,
    /// Which probe is the current one (a late report of an older one is
    /// ignored).
    probe: u64,
}

/// Opens after `threshold` failures in a row; after `cool_down` lets a
/// single probe through; closes when a probe succeeds, opens again when it
/// fails. Logs one error line when it opens and one when it closes.
///
/// Calls that were in flight together and fail together count as one
/// failure: a failure counts only if its call started after the last
/// counted failure was recorded. A pause of this process or of the store
/// (a VM descheduled, a container's CPU quota spent, a page-fault storm)
/// times out every call in flight at once; counted one by one, 64 calls
/// in flight opened the breaker at once, and a fail-closed route refused
/// everything for the whole cool-down after a 100 ms pause, the store
/// healthy throughout. A store that is down fails the calls made after
/// each failure too, and still opens the breaker, after `threshold` of
/// them in turn. [`record`](Self::record) takes its call as started when
/// it reports; a [`Permit`] knows when its call started.
///
/// No state outlives its deadline: a probe that never reports (its future
/// was dropped, or it ran past the [probe deadline](Self::probe_deadline))
/// counts as a failed probe, so the breaker opens again and probes anew
/// after the cool-down. Take a [`Permit`] with [`permit`](Self::permit) to
/// have a dropped call reported as a failure on its own.
///
/// ```
/// use norepeat::store::{Breaker, BreakerState};
/// use std::time::Duration;
/// let b = Breaker::new(2, Duration::from_secs(60));
/// // Two calls in flight together, failing together: one failure.
/// let (first, second) = (b.permit().unwrap(), b.permit().unwrap());
/// first.record(false);
/// second.record(false);
/// assert_eq!(b.state(), BreakerState::Closed);
/// // A call made after that failure fails too: two in a row.
/// b.permit().unwrap().record(false);
/// assert_eq!(b.state(), BreakerState::Open);
/// assert!(!b.allow());
/// ```
#[derive(Debug)]
pub struct Breaker {
    inner: Mutex<Inner>,
    threshold: u32,
    cool_down: Duration,
    probe_deadline: Duration,
    name: &'static str,
}

/// The right to make one call through a [`Breaker`]. Report the call's
/// outcome with [`record`](Self::record); a permit dropped without a report
/// (the call's future was dropped) counts as a failure if it was the probe.
///
/// ```
/// use norepeat::store::{Breaker, BreakerState};
/// use std::time::Duration;
/// let b = Breaker::new(1, Duration::ZERO);
/// b.permit().expect("closed").record(false);
/// assert_eq!(b.state(), BreakerState::Open);
/// let probe = b.permit().expect("cool-down over: the probe");
/// drop(probe); // cancelled: a failed probe, not a wedged breaker
/// assert_eq!(b.state(), BreakerState::Open);
/// b.permit().expect("the next probe").record(true);
/// assert_eq!(b.state(), BreakerState::Closed);
/// ```
#[derive(Debug)]
#[must_use = "a permit reports the outcome of one call"]
pub struct Permit<'a> {
    breaker: &'a Breaker,
    /// The probe's number, if this call is the half-open probe.
    probe: Option<u64>,
    /// When the call was let through.
    started: Instant,
    reported: bool,
}

impl Permit<'_> {
    /// Reports the outcome of the call.
    pub fn record(mut self, ok: bool) {
        self.reported = true;
        self.breaker.report(self.probe, ok, self.started);
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if !self.reported && self.probe.is_some() {
            self.breaker.report(self.probe, false, self.started);
        }
    }
}

impl Breaker {
    /// A closed breaker.
    #[must_use]
    pub fn new(threshold: u32, cool_down: Duration) -> Self {
        Self {
            inner: Mutex::new(Inner {
                state: BreakerState::Closed,
                failures: 0,
                last_failure: None,
                opened_at: Instant::now(),
                probe_started: Instant::now(),
                probe: 0,
            }),
            threshold: threshold.max(1),
            cool_down,
            probe_deadline: Duration::from_secs(1),
            name: "store",
        }
    }

    /// How long a probe may go without reporting before it counts as failed
    /// (default 1 s, the longest store budget).
    #[must_use]
    pub fn probe_deadline(mut self, deadline: Duration) -> Self {
        self.probe_deadline = deadline;
        self
    }

    /// Failures in a row that open the breaker (calls in flight together
    /// failing as one).
    #[must_use]
    pub fn threshold(&self) -> u32 {
        self.threshold
    }

    /// How long the breaker stays open before it lets a probe through.
    #[must_use]
    pub fn cool_down(&self) -> Duration {
        self.cool_down
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

    /// A probe past its deadline counts as failed.
    fn expire(&self, g: &mut Inner) {
        if g.state == BreakerState::HalfOpen && g.probe_started.elapsed() >= self.probe_deadline {
            tracing::warn!(
                breaker = self.name,
                "the breaker's probe did not report in time: counted as failed"
            );
            self.open(g);
        }
    }

    /// The current state.
    #[must_use]
    pub fn state(&self) -> BreakerState {
        let mut g = self.lock();
        self.expire(&mut g);
        g.state
    }

    /// Whether a call may go to the store now. In the open state, the first
    /// caller after the cool-down becomes the probe; it must report with
    /// [`record`](Self::record) (or, better, use [`permit`](Self::permit),
    /// which reports a dropped probe by itself). A probe that never reports
    /// counts as failed after the probe deadline.
    #[must_use]
    pub fn allow(&self) -> bool {
        self.admit().is_some()
    }

    /// Like [`allow`](Self::allow), as a [`Permit`] that counts a dropped,
    /// unreported probe as a failure.
    pub fn permit(&self) -> Option<Permit<'_>> {
        self.admit().map(|probe| Permit {
            breaker: self,
            probe,
            started: Instant::now(),
            reported: false,
        })
    }

    /// `Some(None)`: a call in the closed state; `Some(Some(n))`: probe `n`.
    fn admit(&self) -> Option<Option<u64>> {
        let mut g = self.lock();
        self.expire(&mut g);
        match g.state {
            BreakerState::Closed => Some(None),
            BreakerState::HalfOpen => None,
            BreakerState::Open if g.opened_at.elapsed() >= self.cool_down => {
                g.state = BreakerState::HalfOpen;
                g.probe_started = Instant::now();
                g.probe = g.probe.wrapping_add(1);
                Some(Some(g.probe))
            }
            BreakerState::Open => None,
        }
    }

    fn report(&self, probe: Option<u64>, ok: bool, started: Instant) {
        let mut g = self.lock();
        if let Some(n) = probe
            && (g.state != BreakerState::HalfOpen || g.probe != n)
        {
            // A probe already counted as failed (past its deadline).
            return;
        }
        self.apply(&mut g, ok, started);
    }

    /// Records the outcome of a call that [`allow`](Self::allow) let
    /// through, as a call that started now (a [`Permit`] knows better).
    pub fn record(&self, ok: bool) {
        let mut g = self.lock();
        self.apply(&mut g, ok, Instant::now());
    }

    /// The store answered a call that had already been counted as failed
    /// (its caller gave up waiting): it is slow, not down. The failures
    /// counted so far no longer run in a row, and an open or half-open
    /// breaker closes: the answers come, and a caller that learns from them
    /// (as [`Resilient`](super::Resilient) does, raising its budget) now
    /// waits for them. A store that is silent never calls this, so it opens
    /// the breaker as before.
    ///
    /// ```
    /// use norepeat::store::{Breaker, BreakerState};
    /// use std::time::Duration;
    /// let b = Breaker::new(2, Duration::from_secs(60));
    /// b.record(false);
    /// b.record(false);
    /// assert_eq!(b.state(), BreakerState::Open);
    /// b.record_late_answer(); // an answer of one of those calls came
    /// assert_eq!(b.state(), BreakerState::Closed);
    /// ```
    pub fn record_late_answer(&self) {
        let mut g = self.lock();
        self.expire(&mut g);
        match g.state {
            BreakerState::Closed => g.failures = 0,
            BreakerState::Open | BreakerState::HalfOpen => {
                // A probe under way reports into the closed state: ignored.
                self.apply_close(&mut g, "circuit breaker closed: the store answers, late");
            }
        }
    }

    fn apply_close(&self, g: &mut Inner, why: &'static str) {
        g.state = BreakerState::Closed;
        g.failures = 0;
        tracing::error!(breaker = self.name, "{why}");
        metrics::gauge!("norepeat_breaker_open", "breaker" => self.name).set(0.0);
    }

    fn apply(&self, g: &mut Inner, ok: bool, started: Instant) {
        match (g.state, ok) {
            (BreakerState::Closed, true) => g.failures = 0,
            // In flight with the last failure counted: the same failure.
            (BreakerState::Closed, false) if g.last_failure.is_some_and(|at| started < at) => {}
            (BreakerState::Closed, false) => {
                g.failures += 1;
                g.last_failure = Some(Instant::now());
                if g.failures >= self.threshold {
                    self.open(g);
                }
            }
            (BreakerState::HalfOpen, true) => {
                self.apply_close(g, "circuit breaker closed: store answers again");
            }
            (BreakerState::HalfOpen, false) => self.open(g),
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
    fn a_dropped_probe_counts_as_failed() {
        let b = Breaker::new(1, Duration::ZERO);
        b.record(false);
        drop(b.permit().expect("probe"));
        assert_eq!(b.state(), BreakerState::Open);
        b.permit().expect("a new probe").record(true);
        assert_eq!(b.state(), BreakerState::Closed);
        // A call dropped while closed is no failure.
        drop(b.permit().expect("closed"));
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn a_silent_probe_expires() {
        let b = Breaker::new(1, Duration::ZERO).probe_deadline(Duration::ZERO);
        b.record(false);
        assert!(b.allow(), "the probe, which never reports");
        assert_eq!(b.state(), BreakerState::Open, "past its deadline");
        let late = b.permit().expect("the next probe");
        b.record(true);
        assert_eq!(b.state(), BreakerState::Closed);
        drop(late);
    }

    /// The finding: a 100 ms pause of the gateway (SIGSTOP, as a VM
    /// descheduled) timed out the 64 store calls in flight at once; counted
    /// one by one they opened the breaker, and a fail-closed route refused
    /// about 60,000 requests in the cool-down's second, the store healthy.
    #[test]
    fn calls_in_flight_together_fail_as_one() {
        let b = Breaker::new(5, Duration::from_secs(3600));
        let in_flight: Vec<_> = (0..64).map(|_| b.permit().expect("closed")).collect();
        for call in in_flight {
            call.record(false);
        }
        assert_eq!(b.state(), BreakerState::Closed, "one pause, one failure");
        // A store that stays down fails the calls made after it, each in
        // turn: the breaker opens after the threshold of them.
        for n in 2..5 {
            b.permit().expect("closed").record(false);
            assert_eq!(b.state(), BreakerState::Closed, "{n} failures");
        }
        b.permit().expect("closed").record(false);
        assert_eq!(b.state(), BreakerState::Open);
    }

    /// A success between two failures ends the run, and a call in flight
    /// with a failure already counted does not start a new one.
    #[test]
    fn a_success_ends_the_run_and_old_calls_stay_counted() {
        let b = Breaker::new(2, Duration::from_secs(3600));
        let old = b.permit().expect("closed");
        b.permit().expect("closed").record(false);
        b.permit().expect("closed").record(true);
        b.permit().expect("closed").record(false);
        old.record(false);
        assert_eq!(
            b.state(),
            BreakerState::Closed,
            "the old call failed with the first"
        );
        b.permit().expect("closed").record(false);
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
