//! Repeated warnings, at most one line per place in the code per
//! interval: a store that is down must not write a warning per request
//! (4,821 lines in 7 s, issue 54). The lines left out are counted, and
//! said once per interval, with their count and where they come from.
//! [`subscriber`] is the process's log: the level filter, then this.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tracing::callsite::Identifier;
use tracing::level_filters::LevelFilter;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::{EnvFilter, FilterExt};
use tracing_subscriber::layer::{Context, Filter, SubscriberExt};

/// The gateway's log on stderr: `directives` as `RUST_LOG` reads (`info`
/// when empty or not understood), one JSON object a line with `json`,
/// colours with `ansi`, and warnings repeated per place held back by
/// `throttle`.
///
/// A line below the level costs nothing: the level is known before a
/// span or an event is built.
///
/// ```
/// use norepeat_gateway::throttle::{Throttle, subscriber};
///
/// let log = subscriber("", false, false, Throttle::default());
/// tracing::subscriber::with_default(log, || {
///     assert!(tracing::debug_span!("decide").is_disabled());
///     assert!(!tracing::info_span!("serve").is_disabled());
/// });
/// ```
pub fn subscriber(
    directives: &str,
    json: bool,
    ansi: bool,
    throttle: Throttle,
) -> impl Subscriber + Send + Sync + 'static {
    let filter = || match directives.trim() {
        "" => EnvFilter::new("info"),
        d => EnvFilter::try_new(d).unwrap_or_else(|_| EnvFilter::new("info")),
    };
    let text = (!json).then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
            .with_filter(filter().and(throttle.clone()))
    });
    let json = json.then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_filter(filter().and(throttle.clone()))
    });
    tracing_subscriber::registry().with(text).with(json)
}

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

    /// Every level passes (only repeats are held back). Said, so that the
    /// level filter beside it keeps its own: with no hint, every `debug`
    /// span of the guards was built on every request, and thrown away.
    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::TRACE)
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
    fn a_line_below_the_level_is_never_built() {
        for json in [false, true] {
            let log = subscriber("", json, false, Throttle::default());
            assert_eq!(log.max_level_hint(), Some(LevelFilter::INFO), "json {json}");
            tracing::subscriber::with_default(log, || {
                assert!(tracing::debug_span!("norepeat.decide").is_disabled());
                assert!(!tracing::info_span!("serve").is_disabled());
            });
        }
        let log = subscriber("warn,norepeat=debug", false, false, Throttle::default());
        assert_eq!(log.max_level_hint(), Some(LevelFilter::DEBUG));
        let log = subscriber("not a directive ===", false, false, Throttle::default());
        assert_eq!(log.max_level_hint(), Some(LevelFilter::INFO), "the default");
    }

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
