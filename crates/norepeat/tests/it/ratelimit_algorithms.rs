//! Property tests of the rate-limit algorithms on an injected clock: the
//! pure functions take `now` as an argument, so a test drives time with a
//! plain number and never sleeps.

use norepeat::store::rate::arithmetic::{
    FixedState, SlidingState, fixed_window, gcra, sliding_window,
};
use proptest::prelude::*;

/// Arrival times (µs) from gaps: many zero gaps (bursts), some long ones.
fn arrivals(max_gap: u64) -> impl Strategy<Value = Vec<u64>> {
    proptest::collection::vec(
        prop_oneof![3 => Just(0u64), 5 => 0..max_gap, 1 => 0..(10 * max_gap)],
        1..300,
    )
    .prop_map(|gaps| {
        let mut t = 1_000_000u64;
        gaps.into_iter()
            .map(|g| {
                t += g;
                t
            })
            .collect()
    })
}

/// Times of the admitted requests when `arrivals` hit `step`.
fn admitted<S>(arrivals: &[u64], mut step: impl FnMut(Option<S>, u64) -> (S, bool)) -> Vec<u64>
where
    S: Copy,
{
    let mut state = None;
    let mut out = Vec::new();
    for &t in arrivals {
        let (s, ok) = step(state, t);
        state = Some(s);
        if ok {
            out.push(t);
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Over any interval [a, b], GCRA admits at most burst + (b - a) / emission.
    #[test]
    fn gcra_admits_at_most_burst_plus_rate_times_interval(
        times in arrivals(50_000),
        emission in 1u64..20_000,
        burst in 1u64..10,
    ) {
        let ok = admitted::<u64>(&times, |tat, now| {
            let (tat, d) = gcra(tat, now, emission, burst);
            (tat, d.allowed)
        });
        for i in 0..ok.len() {
            for j in i..ok.len() {
                let count = (j - i + 1) as u64;
                let span = ok[j] - ok[i];
                prop_assert!(
                    count.saturating_sub(burst) * emission <= span,
                    "{count} admitted in {span} µs (emission {emission}, burst {burst})"
                );
            }
        }
    }

    /// GCRA is not stricter than its rate: requests spaced by the emission
    /// interval are all admitted, and a fresh key admits a whole burst.
    #[test]
    fn gcra_admits_the_sustained_rate_and_a_burst(
        emission in 1u64..20_000,
        burst in 1u64..10,
        n in 1usize..50,
    ) {
        let spaced: Vec<u64> = (0..n as u64).map(|i| 1_000 + i * emission).collect();
        prop_assert_eq!(admitted::<u64>(&spaced, |tat, now| {
            let (tat, d) = gcra(tat, now, emission, burst);
            (tat, d.allowed)
        }).len(), n);
        let at_once = vec![1_000u64; burst as usize + 3];
        prop_assert_eq!(admitted::<u64>(&at_once, |tat, now| {
            let (tat, d) = gcra(tat, now, emission, burst);
            (tat, d.allowed)
        }).len() as u64, burst);
    }

    /// A refused GCRA request learns when to come back, and is admitted then.
    #[test]
    fn gcra_reset_is_exact(emission in 1u64..20_000, burst in 1u64..5, extra in 1u64..4) {
        let mut tat = None;
        let now = 5_000u64;
        let mut last = None;
        for _ in 0..burst + extra {
            let (t, d) = gcra(tat, now, emission, burst);
            tat = Some(t);
            last = Some(d);
        }
        let d = last.unwrap();
        prop_assert!(!d.allowed);
        let wait = d.reset.as_micros() as u64;
        prop_assert!(!gcra(tat, now + wait - 1, emission, burst).1.allowed);
        prop_assert!(gcra(tat, now + wait, emission, burst).1.allowed);
    }

    /// The fixed window never admits more than `limit` in one window, and
    /// (as a consequence) at most `2 * limit` in any window-long interval.
    #[test]
    fn fixed_window_admits_at_most_limit_per_window(
        times in arrivals(50_000),
        window in 1u64..200_000,
        limit in 1u64..20,
    ) {
        let mut state: Option<FixedState> = None;
        let mut per_window = std::collections::HashMap::<u64, u64>::new();
        let mut ok = Vec::new();
        for &t in &times {
            let (s, d) = fixed_window(state, t, limit, window);
            prop_assert!(s.window_end > t && s.window_end - t <= window);
            if d.allowed {
                *per_window.entry(s.window_end).or_default() += 1;
                ok.push(t);
            }
            state = Some(s);
        }
        prop_assert!(per_window.values().all(|&n| n <= limit), "{per_window:?}");
        for i in 0..ok.len() {
            let n = ok[i..].iter().take_while(|&&t| t < ok[i] + window).count() as u64;
            prop_assert!(n <= 2 * limit);
        }
    }

    /// The sliding window stays within its documented bound: at most
    /// `limit` per aligned window, at most `2 * limit - 1` in any
    /// window-long interval.
    #[test]
    fn sliding_window_error_stays_within_its_bound(
        times in arrivals(50_000),
        window in 2u64..200_000,
        limit in 1u64..20,
    ) {
        let mut per_index = std::collections::HashMap::<u64, u64>::new();
        let ok = admitted::<SlidingState>(&times, |s, now| {
            let (s, d) = sliding_window(s, now, limit, window);
            if d.allowed {
                *per_index.entry(now / window).or_default() += 1;
            }
            (s, d.allowed)
        });
        prop_assert!(per_index.values().all(|&n| n <= limit), "{per_index:?}");
        for i in 0..ok.len() {
            let n = ok[i..].iter().take_while(|&&t| t < ok[i] + window).count() as u64;
            prop_assert!(n < 2 * limit, "{n} admitted within one window (limit {limit})");
        }
    }

    /// A refused sliding-window request is admitted once its reset has
    /// passed (if nothing else came in between).
    #[test]
    fn sliding_window_reset_is_enough(
        times in arrivals(50_000),
        window in 2u64..200_000,
        limit in 1u64..10,
    ) {
        let mut state = None;
        for &t in &times {
            let (s, d) = sliding_window(state, t, limit, window);
            state = Some(s);
            if !d.allowed {
                let later = t + d.reset.as_micros() as u64;
                prop_assert!(sliding_window(state, later, limit, window).1.allowed);
            }
        }
    }
}

/// The sliding window's `2 * limit - 1` bound is reached, so it is the bound.
#[test]
fn sliding_window_bound_is_tight() {
    let (window, limit) = (1_000_000u64, 10u64);
    let mut state = None;
    let mut n = 0;
    // `limit` at the very end of one window ...
    for _ in 0..limit {
        let (s, d) = sliding_window(state, 2 * window - 2, limit, window);
        state = Some(s);
        n += u64::from(d.allowed);
    }
    // ... then as many as admitted at the end of the next, 1 µs short of a window later.
    for _ in 0..limit {
        let (s, d) = sliding_window(state, 3 * window - 3, limit, window);
        state = Some(s);
        n += u64::from(d.allowed);
    }
    assert_eq!(n, 2 * limit - 1);
}

/// A sliding-window state far ahead of `now` (another window size wrote
/// it, or the clock jumped back) is stale: the request is judged on a fresh
/// window instead of being refused until that future comes.
#[test]
fn sliding_window_far_ahead_is_stale() {
    let (window, limit) = (1_000_000u64, 5u64);
    let now = 1_700_000_000_000_000u64;
    // What a 1-second window leaves behind, read with a 60-second window.
    let left = SlidingState {
        index: now / window,
        current: 100,
        previous: 100,
    };
    let (s, d) = sliding_window(Some(left), now, 100, 60 * window);
    assert!(d.allowed, "{d:?}");
    assert_eq!(s.index, now / (60 * window));
    assert!(d.reset <= std::time::Duration::from_secs(60), "{d:?}");
    // One window ahead is kept (a clock read just before the key's lock).
    let next = SlidingState {
        index: now / window + 1,
        current: limit,
        previous: 0,
    };
    assert!(!sliding_window(Some(next), now, limit, window).1.allowed);
}

/// A fixed window that ends later than one window from now is stale.
#[test]
fn fixed_window_far_ahead_is_stale() {
    let now = 5_000_000u64;
    let left = FixedState {
        count: 1_000,
        window_end: now + 3_600_000_000,
    };
    let (s, d) = fixed_window(Some(left), now, 5, 1_000_000);
    assert!(d.allowed, "{d:?}");
    assert_eq!(s.window_end, now + 1_000_000);
}

/// A GCRA arrival time beyond one burst from now cannot come from this
/// quota: it is capped, so the wait is at most one emission interval.
#[test]
fn gcra_far_ahead_waits_one_emission_at_most() {
    let (now, emission) = (5_000_000u64, 10_000u64);
    let (_, d) = gcra(Some(now + 3_600_000_000), now, emission, 1);
    assert!(!d.allowed);
    assert!(d.reset.as_micros() as u64 <= emission, "{d:?}");
    let (_, d) = gcra(Some(now + 3_600_000_000), now, emission, 3);
    assert!(d.reset.as_micros() as u64 <= emission, "{d:?}");
}
