//! A metrics recorder that keeps what the code under test recorded.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

/// A metric's labels, sorted by name.
pub type Labels = Vec<(String, String)>;

/// A metric's name and its sorted labels.
type Series = (String, Labels);

/// A [`metrics::Recorder`] that keeps every counter's value, by name and
/// labels, and the name and labels of every metric registered (counters,
/// gauges and histograms; the values of the last two are dropped).
///
/// Two ways to install it:
///
/// * [`Recorded::global`]: the process's global recorder, for code that
///   records from threads or tasks of its own (a multi-thread runtime). A
///   process holds one global recorder, so every caller in the process gets
///   the same one: nextest runs each test in its own process, so a test's
///   counts are its own there.
/// * `metrics::set_default_local_recorder(&recorded)`: this thread's, for a
///   test on a current-thread runtime, whose counts are its own whatever runs
///   the tests.
///
/// ```
/// use norepeat_testkit::Recorded;
///
/// let recorded = Recorded::default();
/// {
///     let _local = metrics::set_default_local_recorder(&recorded);
///     metrics::counter!("orders_total", "outcome" => "new").increment(2);
///     metrics::counter!("orders_total", "outcome" => "replay").increment(1);
///     metrics::gauge!("open").set(1.0);
/// }
/// assert_eq!(recorded.counter("orders_total"), 3);
/// assert_eq!(recorded.series("orders_total").len(), 2);
/// assert!(recorded.registered("orders_total", &[("outcome", "replay")]));
/// assert!(recorded.registered("open", &[]));
/// assert!(!recorded.registered("closed", &[]));
/// ```
#[derive(Debug, Default)]
pub struct Recorded {
    counters: Mutex<BTreeMap<Series, Arc<AtomicU64>>>,
    registered: Mutex<BTreeSet<Series>>,
}

impl Recorded {
    /// The process's global recorder: installed by the first call, the
    /// same one for every later call in the process.
    ///
    /// # Panics
    ///
    /// Panics when another global recorder was installed first (by code
    /// other than this function).
    pub fn global() -> &'static Recorded {
        static GLOBAL: OnceLock<&'static Recorded> = OnceLock::new();
        GLOBAL.get_or_init(|| {
            let recorded: &'static Recorded = Box::leak(Box::default());
            metrics::set_global_recorder(Global(recorded))
                .expect("norepeat-testkit: another global metrics recorder is installed");
            recorded
        })
    }

    /// The counter `name`, summed over all its labels (0 when never
    /// counted).
    pub fn counter(&self, name: &str) -> u64 {
        self.series(name).values().sum()
    }

    /// Every series of the counter `name`: its labels and its value.
    pub fn series(&self, name: &str) -> BTreeMap<Labels, u64> {
        lock(&self.counters)
            .iter()
            .filter(|((n, _), _)| n == name)
            .map(|((_, labels), value)| (labels.clone(), value.load(Ordering::SeqCst)))
            .collect()
    }

    /// True when a metric `name` (of any kind) has been registered with at
    /// least the labels `labels`.
    pub fn registered(&self, name: &str, labels: &[(&str, &str)]) -> bool {
        lock(&self.registered).iter().any(|(n, have)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| have.iter().any(|(hk, hv)| hk == k && hv == v))
        })
    }

    /// Every metric registered, as `name{label=value,...}`: for a failing
    /// test's message.
    pub fn registered_names(&self) -> Vec<String> {
        lock(&self.registered)
            .iter()
            .map(|(name, labels)| {
                if labels.is_empty() {
                    return name.clone();
                }
                let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!("{name}{{{}}}", labels.join(","))
            })
            .collect()
    }

    fn register(&self, key: &Key) -> Series {
        let mut labels: Labels = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        labels.sort();
        let series = (key.name().to_owned(), labels);
        lock(&self.registered).insert(series.clone());
        series
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Recorder for Recorded {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let series = self.register(key);
        Counter::from_arc(Arc::clone(lock(&self.counters).entry(series).or_default()))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.register(key);
        Gauge::noop()
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.register(key);
        Histogram::noop()
    }
}

/// [`Recorded::global`]'s recorder as `metrics` holds it (by value).
struct Global(&'static Recorded);

impl Recorder for Global {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
        self.0.describe_counter(key, unit, text);
    }
    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
        self.0.describe_gauge(key, unit, text);
    }
    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
        self.0.describe_histogram(key, unit, text);
    }
    fn register_counter(&self, key: &Key, meta: &Metadata<'_>) -> Counter {
        self.0.register_counter(key, meta)
    }
    fn register_gauge(&self, key: &Key, meta: &Metadata<'_>) -> Gauge {
        self.0.register_gauge(key, meta)
    }
    fn register_histogram(&self, key: &Key, meta: &Metadata<'_>) -> Histogram {
        self.0.register_histogram(key, meta)
    }
}
