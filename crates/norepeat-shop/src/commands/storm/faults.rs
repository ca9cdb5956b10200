//! The log of the store outages the storm injects on purpose.
//!
//! Taking the guard store down is how the storm shows what an outage does,
//! and the library says so loudly, as it should for a real one: a warning
//! for every request admitted without a decision, an error when a breaker
//! opens. In a storm that ran as designed those were some 300 lines of
//! WARN and ERROR beside exit 0. While an outage the storm injected lasts
//! (from the switch going down until every breaker it opened has closed
//! again, or its shops are gone), the library's store-failure lines
//! ([`FAULT_TARGETS`]) are counted instead of printed, and the run ends
//! with one info line that says how many of each there were. Everything
//! else stays as it is: the shop's own warnings (a database failure), and
//! the same library lines outside an injected outage (a `--redis` that
//! fails by itself).
//!
//! The library's logging is left alone: a user's service whose store dies
//! still gets every warning.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, Filter};
use tracing_subscriber::registry::LookupSpan;

/// The library's modules whose warnings and errors report a store failure
/// and what was done about it: the failure policy's decision, the
/// breaker, a token use or a key that could not be given back.
///
/// ```
/// use norepeat_shop::commands::storm::FAULT_TARGETS;
/// assert!(FAULT_TARGETS.contains(&"norepeat::degrade"));
/// ```
pub const FAULT_TARGETS: [&str; 4] = [
    "norepeat::degrade",
    "norepeat::store::breaker",
    "norepeat::token",
    "norepeat::claim",
];

/// A kind of log line: its level, target and message.
type LineKind = (Level, &'static str, String);

/// Whether an outage is being injected, and what it has logged so far.
/// Cheap to clone: the clones share one state.
///
/// ```
/// use norepeat_shop::commands::storm::InjectedFaults;
/// use tracing_subscriber::layer::SubscriberExt;
/// use tracing_subscriber::{Layer, Registry};
///
/// let faults = InjectedFaults::default();
/// let subscriber = Registry::default()
///     .with(tracing_subscriber::fmt::layer().with_filter(faults.hidden()))
///     .with(faults.counter());
/// tracing::subscriber::with_default(subscriber, || {
///     faults.begin();
///     tracing::warn!(target: "norepeat::degrade", "store failed: admitting (fail-open)");
///     faults.end();
/// });
/// assert_eq!(
///     faults.summary().as_deref(),
///     Some("1 × WARN norepeat::degrade \"store failed: admitting (fail-open)\"")
/// );
/// ```
#[derive(Debug, Clone, Default)]
pub struct InjectedFaults {
    on: Arc<AtomicBool>,
    /// How many lines of each kind.
    counts: Arc<Mutex<BTreeMap<LineKind, u64>>>,
}

impl InjectedFaults {
    /// An outage starts: the store-failure lines from now on are its own.
    pub fn begin(&self) {
        self.on.store(true, Ordering::SeqCst);
    }

    /// The outage and all it set off are over: store-failure lines are
    /// real problems again.
    pub fn end(&self) {
        self.on.store(false, Ordering::SeqCst);
    }

    /// Whether an injected outage is under way.
    ///
    /// ```
    /// use norepeat_shop::commands::storm::InjectedFaults;
    /// let faults = InjectedFaults::default();
    /// faults.begin();
    /// assert!(faults.injecting());
    /// faults.end();
    /// assert!(!faults.injecting());
    /// ```
    #[must_use]
    pub fn injecting(&self) -> bool {
        self.on.load(Ordering::SeqCst)
    }

    /// Whether a line with `meta` belongs to the injected outage.
    fn owns(&self, meta: &Metadata<'_>) -> bool {
        meta.is_event()
            && *meta.level() <= Level::WARN
            && is_fault_target(meta.target())
            && self.injecting()
    }

    /// The filter for the layer that prints: every line but the injected
    /// outage's.
    #[must_use]
    pub fn hidden(&self) -> Hidden {
        Hidden(self.clone())
    }

    /// The layer that counts the injected outage's lines.
    #[must_use]
    pub fn counter<S>(&self) -> impl Layer<S> + use<S>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        // A filter of its own: a layer's `enabled` would filter for every
        // layer of the subscriber.
        Counter(self.clone()).with_filter(Owned(self.clone()))
    }

    /// What the injected outages logged, how many of each, most first
    /// (`None`: nothing).
    #[must_use]
    pub fn summary(&self) -> Option<String> {
        let counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let mut lines: Vec<_> = counts.iter().collect();
        lines.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
        let mut out = String::new();
        for ((level, target, message), n) in lines {
            if !out.is_empty() {
                out.push_str(", ");
            }
            let _ = write!(out, "{n} × {level} {target} {message:?}");
        }
        (!out.is_empty()).then_some(out)
    }
}

/// `target` is one of [`FAULT_TARGETS`] or a module inside one.
fn is_fault_target(target: &str) -> bool {
    FAULT_TARGETS.iter().any(|t| {
        target
            .strip_prefix(t)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
    })
}

/// Lets through every line but those of an injected outage (see
/// [`InjectedFaults::hidden`]).
///
/// ```
/// use norepeat_shop::commands::storm::InjectedFaults;
/// use tracing_subscriber::layer::SubscriberExt;
/// use tracing_subscriber::{Layer, Registry};
///
/// let faults = InjectedFaults::default();
/// // The printing layer prints everything but the injected outages' lines.
/// let printing = tracing_subscriber::fmt::layer().with_filter(faults.hidden());
/// let _subscriber = Registry::default().with(printing);
/// ```
#[derive(Debug, Clone)]
pub struct Hidden(InjectedFaults);

impl<S> Filter<S> for Hidden {
    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        // "Sometimes" asks `enabled` for every line of the callsite: the
        // answer changes as outages begin and end.
        if meta.is_event() && *meta.level() <= Level::WARN && is_fault_target(meta.target()) {
            Interest::sometimes()
        } else {
            Interest::always()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        !self.0.owns(meta)
    }

    /// Every level passes: said, so that the level filter beside it keeps
    /// its own (with no hint, every `debug` span would be built).
    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::TRACE)
    }
}

/// Selects the lines of an injected outage, for [`Counter`].
#[derive(Debug, Clone)]
struct Owned(InjectedFaults);

impl<S> Filter<S> for Owned {
    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        // Only the library's store-failure warnings can ever be counted:
        // no other line is built for the counter's sake.
        if meta.is_event() && *meta.level() <= Level::WARN && is_fault_target(meta.target()) {
            Interest::sometimes()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        self.0.owns(meta)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::WARN)
    }
}

/// Counts the lines [`Owned`] lets through.
#[derive(Debug, Clone)]
struct Counter(InjectedFaults);

impl<S: Subscriber> Layer<S> for Counter {
    fn on_event(&self, event: &Event<'_>, _cx: Context<'_, S>) {
        let meta = event.metadata();
        let mut message = Message(String::new());
        event.record(&mut message);
        let mut counts = self.0.counts.lock().unwrap_or_else(PoisonError::into_inner);
        *counts
            .entry((*meta.level(), meta.target(), message.0))
            .or_default() += 1;
    }
}

/// An event's `message` field.
struct Message(String);

impl Visit for Message {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            value.clone_into(&mut self.0);
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use tracing_subscriber::layer::SubscriberExt;

    /// A writer into a shared buffer, for the printing layer.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().write(buf)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn printed_with(faults: &InjectedFaults, log: impl FnOnce()) -> String {
        let out = Buffer::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .with_writer(move || writer.clone())
                    .with_filter(faults.hidden()),
            )
            .with(faults.counter());
        tracing::subscriber::with_default(subscriber, log);
        let bytes = out.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn an_injected_outages_store_failures_are_counted_not_printed() {
        let faults = InjectedFaults::default();
        let printed = printed_with(&faults, || {
            faults.begin();
            for mode in ["token", "fingerprint", "token"] {
                tracing::warn!(target: "norepeat::degrade", mode, "store failed: admitting (fail-open)");
            }
            tracing::error!(target: "norepeat::store::breaker", breaker = "store", "circuit breaker opened");
            faults.end();
        });
        assert_eq!(printed, "");
        assert_eq!(
            faults.summary().as_deref(),
            Some(
                "3 × WARN norepeat::degrade \"store failed: admitting (fail-open)\", \
                 1 × ERROR norepeat::store::breaker \"circuit breaker opened\""
            )
        );
    }

    #[test]
    fn real_problems_stay_warnings() {
        let faults = InjectedFaults::default();
        let printed = printed_with(&faults, || {
            // The same line outside an injected outage: a real store failure.
            tracing::warn!(target: "norepeat::degrade", "store failed: admitting (fail-open)");
            faults.begin();
            // The shop's own problem during one: not the outage's doing.
            tracing::error!(target: "norepeat_shop::error", "database failure");
            // A module that only starts like a fault target.
            tracing::warn!(target: "norepeat::degraded", "elsewhere");
            // The library's info lines are not warnings to quiet.
            tracing::info!(target: "norepeat::store::breaker", "noted");
            faults.end();
        });
        assert!(
            printed.contains("WARN norepeat::degrade: store failed"),
            "{printed}"
        );
        assert!(
            printed.contains("ERROR norepeat_shop::error: database failure"),
            "{printed}"
        );
        assert!(
            printed.contains("WARN norepeat::degraded: elsewhere"),
            "{printed}"
        );
        assert!(
            printed.contains("INFO norepeat::store::breaker: noted"),
            "{printed}"
        );
        assert_eq!(faults.summary(), None);
    }
}
