//! Repeated warnings, at most one line per place in the code per
//! interval: a store that is down must not write a warning per request
//! (4,821 lines in 7 s, issue 54). The lines left out are counted, and
//! said once per interval, with their count and where they come from.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tracing::callsite::Identifier;
use tracing::{Event, Level, Metadata};
use tracing_subscriber::layer::{Context, Filter};

/// How often one place in the code may warn.
pub const EVERY: Duration = Duration::from_secs(10);

/// The warnings and errors let through, by the place that logs them.
#[derive(Clone, Default)]
pub struct Throttle {
    seen: Arc<Mutex<HashMap<Identifier, Seen>>>,
}

struct Seen {
    /// When one of its lines was last let through.
    last: Instant,
    /// The lines left out since, and where they come from.
    left_out: u64,
    place: &'static str,
}

impl Throttle {
    /// Whether a warning or an error logged at `callsite` (`place`, its
    /// name) at `now` is written: the first of an interval is.
    pub fn lets_through(&self, callsite: Identifier, place: &'static str, now: Instant) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        match seen.get_mut(&callsite) {
            Some(s) if now.duration_since(s.last) < EVERY => {
                s.left_out += 1;
                false
            }
            Some(s) => {
                s.last = now;
                true
            }
            None => {
                seen.insert(
                    callsite,
                    Seen {
                        last: now,
                        left_out: 0,
                        place,
                    },
                );
                true
            }
        }
    }

    /// The lines left out since the last call, by place (and the counts
    /// start again).
    pub fn take_left_out(&self) -> Vec<(&'static str, u64)> {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.values_mut()
            .filter(|s| s.left_out > 0)
            .map(|s| (s.place, std::mem::take(&mut s.left_out)))
            .collect()
    }

    /// Says, every [`EVERY`], how many lines were left out where (in a
    /// thread of its own, for the life of the process).
    pub fn report_every_interval(&self) {
        let this = self.clone();
        let _ = std::thread::Builder::new()
            .name("log-throttle".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(EVERY);
                    for (place, n) in this.take_left_out() {
                        tracing::warn!(
                            left_out = n,
                            place,
                            "repeated lines left out (one a place per 10 s)"
                        );
                    }
                }
            });
    }
}

impl<S> Filter<S> for Throttle {
    fn enabled(&self, _: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        true
    }

    fn event_enabled(&self, event: &Event<'_>, _: &Context<'_, S>) -> bool {
        let meta = event.metadata();
        // Information and below pass: only warnings and errors repeat per
        // request when something is down. The throttle's own report too.
        if *meta.level() > Level::WARN || meta.module_path() == Some(module_path!()) {
            return true;
        }
        self.lets_through(meta.callsite(), meta.name(), Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Here;
    impl tracing::callsite::Callsite for Here {
        fn set_interest(&self, _: tracing::subscriber::Interest) {}
        fn metadata(&self) -> &Metadata<'_> {
            unreachable!("not read")
        }
    }
    static A: Here = Here;
    static B: Here = Here;

    #[test]
    fn one_line_a_place_an_interval_and_the_rest_counted() {
        let t = Throttle::default();
        let start = Instant::now();
        let a = || Identifier(&A);
        assert!(t.lets_through(a(), "a", start));
        for i in 1..=100 {
            assert!(!t.lets_through(a(), "a", start + Duration::from_millis(i)));
        }
        assert!(t.lets_through(Identifier(&B), "b", start), "another place");
        assert_eq!(t.take_left_out(), [("a", 100)]);
        assert!(t.take_left_out().is_empty(), "counted once");
        assert!(t.lets_through(a(), "a", start + EVERY), "the next interval");
    }
}
