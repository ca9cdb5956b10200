//! The three rate algorithms as pure functions of (state, now).
//!
//! The memory store calls these under a per-key lock; the Redis scripts in
//! `src/store/redis/lua/` implement the same arithmetic with Redis `TIME` as the
//! clock. Times are in microseconds on the caller's clock.

use super::RateDecision;
use std::time::Duration;

/// A fixed window's counter: how many requests, and when the window ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedState {
    /// Requests counted in this window (admitted or not).
    pub count: u64,
    /// When this window ends.
    pub window_end: u64,
}

/// A sliding window's two counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingState {
    /// Index of the current window (`now / window`).
    pub index: u64,
    /// Admitted in the current window.
    pub current: u64,
    /// Admitted in the previous window.
    pub previous: u64,
}

/// Fixed window, starting at the first request: admit while
/// `count <= limit`.
///
/// A state whose window ends more than `window` from now cannot have been
/// written with this window (another window size left it): it is stale and
/// a new window starts, so a changed quota never locks a client out.
pub fn fixed_window(
    state: Option<FixedState>,
    now: u64,
    limit: u64,
    window: u64,
) -> (FixedState, RateDecision) {
    let mut s = match state {
        Some(s) if s.window_end > now && s.window_end - now <= window => s,
        _ => FixedState {
            count: 0,
            window_end: now.saturating_add(window),
        },
    };
    s.count = s.count.saturating_add(1);
    let allowed = s.count <= limit;
    let decision = RateDecision {
        allowed,
        remaining: limit.saturating_sub(s.count),
        reset: Duration::from_micros(s.window_end - now),
    };
    (s, decision)
}

/// Sliding window approximated by two fixed windows: the previous window's
/// count is weighted by how much of it still overlaps the sliding window.
/// Windows are aligned on multiples of `window` (on Redis: of Redis `TIME`).
///
/// Error bound. The estimate assumes the previous window's requests were
/// spread evenly over it, so it errs both ways:
/// - *Never more than `limit` per aligned window*: the current count alone
///   must stay within `limit`.
/// - *At most `2 * limit - 1` in any window-long interval* `[t, t + window)`
///   (such an interval meets two aligned windows). This is reached: `limit`
///   requests at the very end of one window, then `limit - 1` at the very
///   end of the next, where the earlier ones weigh almost nothing. So the
///   worst-case overshoot is `limit - 1`, just under the fixed window's.
/// - *It can also refuse early*: requests made at the start of the previous
///   window still weigh on the current one after they left the sliding
///   interval.
///
/// With traffic spread evenly over the previous window, the estimate is the
/// true count up to rounding.
///
/// A state from the next window (a clock read before the key's lock was
/// taken, or a store clock that stepped back a little) is kept, and `now`
/// is moved up to that window's start: its counts are not lost. A state
/// further ahead is stale (another window size wrote it, or the clock
/// jumped) and is dropped: obeying it would refuse every call until that
/// far future.
pub fn sliding_window(
    state: Option<SlidingState>,
    now: u64,
    limit: u64,
    window: u64,
) -> (SlidingState, RateDecision) {
    let state = state.filter(|s| s.index <= now / window + 1);
    let now = state.map_or(now, |s| now.max(s.index.saturating_mul(window)));
    let index = now / window;
    let mut s = match state {
        Some(s) if s.index == index => s,
        Some(s) if s.index + 1 == index => SlidingState {
            index,
            current: 0,
            previous: s.current,
        },
        _ => SlidingState {
            index,
            current: 0,
            previous: 0,
        },
    };
    let elapsed = now - index * window;
    let remaining_share = (window - elapsed) as f64 / window as f64;
    let weighted = s.previous as f64 * remaining_share + s.current as f64;
    let allowed = weighted + 1.0 <= limit as f64;
    if allowed {
        s.current += 1;
    }
    let reset = if allowed {
        window - elapsed
    } else {
        sliding_retry_after(&s, elapsed, limit, window)
    };
    let used = s.previous as f64 * remaining_share + s.current as f64;
    let decision = RateDecision {
        allowed,
        remaining: (limit as f64 - used).max(0.0).floor() as u64,
        reset: Duration::from_micros(reset.max(1)),
    };
    (s, decision)
}

/// When a sliding-window state stops mattering: the end of the window after
/// its own, in the same clock as `now`. Its key expires then, however
/// often a refused client calls again.
#[must_use]
pub fn sliding_expires_at(s: &SlidingState, window: u64) -> u64 {
    s.index.saturating_add(2).saturating_mul(window)
}

/// How long until the weighted count leaves room for one more request.
fn sliding_retry_after(s: &SlidingState, elapsed: u64, limit: u64, window: u64) -> u64 {
    let room = limit as f64 - 1.0 - s.current as f64;
    if room >= 0.0 && s.previous > 0 {
        // previous * (window - e) / window <= room  <=>  e >= window * (1 - room / previous)
        let e = (window as f64 * (1.0 - room / s.previous as f64)).ceil() as u64;
        e.saturating_sub(elapsed).max(1)
    } else {
        // This window is full by itself: in the next one it counts as
        // `previous`; wait until its weight leaves room.
        let next = window - elapsed;
        let room_next = limit as f64 - 1.0;
        let weight = if s.current > 0 {
            (window as f64 * (1.0 - room_next / s.current as f64))
                .max(0.0)
                .ceil() as u64
        } else {
            0
        };
        next + weight
    }
}

/// GCRA with `burst` requests allowed at once and one more every `emission`.
/// `tat` is the theoretical arrival time; a request is admitted when
/// `max(tat, now) + emission - burst * emission <= now`.
///
/// Over any interval of length `t`, at most `burst + t / emission` requests
/// are admitted.
///
/// This quota never stores a `tat` beyond `now + burst * emission`; one
/// further ahead (another quota left it, or the clock stepped back) is
/// capped there, so the wait is at most one emission interval.
pub fn gcra(tat: Option<u64>, now: u64, emission: u64, burst: u64) -> (u64, RateDecision) {
    let tolerance = emission.saturating_mul(burst);
    let tat = tat.unwrap_or(now).clamp(now, now.saturating_add(tolerance));
    let new_tat = tat.saturating_add(emission);
    let allow_at = new_tat.saturating_sub(tolerance);
    if allow_at > now {
        let decision = RateDecision {
            allowed: false,
            remaining: 0,
            reset: Duration::from_micros(allow_at - now),
        };
        return (tat, decision);
    }
    let decision = RateDecision {
        allowed: true,
        remaining: now.saturating_add(tolerance).saturating_sub(new_tat) / emission.max(1),
        reset: Duration::from_micros(new_tat - now),
    };
    (new_tat, decision)
}
