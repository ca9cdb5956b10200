// Over 400 lines on purpose: the attribute's runtime: its builder, its modes and the one function the macro calls, with their tests.
//! The runtime of [`#[norepeat::guard]`](macro@crate::guard): [`Guarded`]
//! (window and once mode), [`Rejected`], and the process-wide store.
//!
//! What the attribute expands to: guard one call of any async function, by
//! a key built from its arguments, usable without the macro too.
//!
//! Two modes:
//!
//! - **window** ([`Guarded::window`]): the first call with a key takes it for
//!   the window (default 3 s, counted from the first call) and runs; a repeat
//!   within the window is refused with [`Rejected::Duplicate`] and does not
//!   run. A call that fails (`Err` or panic) releases the key at once, so a
//!   retry runs. A call whose future is dropped mid-body counts as done: the
//!   key is held for the rest of the window. The fingerprint guard's rules
//!   ([`FingerprintGuard`], [`ReleasePolicy::HoldOnSuccess`]), keyed by the
//!   key string instead of a request body.
//! - **once** ([`Guarded::once`]): the key is claimed (`put_if_absent`) while
//!   the body runs, the claim renewed while it runs longer than a third of
//!   its lease; on `Ok(v)` the claim is replaced (owner-checked,
//!   `replace_if_equals`) by `v` serialized as JSON, kept for the retention
//!   (default 24 h). A later call with the key does not run: it gets `Ok(v)`
//!   back, deserialized. A call arriving while the first still runs gets
//!   [`Rejected::InProgress`], or, with a wait ([`Guarded::wait`], the
//!   attribute's `wait = "2s"`), looks again with backoff until the first
//!   call's result is stored and gets it (`InProgress` when the wait is
//!   over; the key itself if the first call failed and freed it). On `Err`
//!   or panic the claim is released
//!   (owner-checked), so the next call runs again: a failure is never
//!   remembered, only a success is.
//!
//! # Which store
//! [`Guarded`] takes the store on each call. The attribute uses
//! `store = EXPR` when given, else the process-wide store: set it once at
//! start with [`set_default_store`], and every guarded function that names
//! no store (a free function has no `self` to hold one) shares it. Before
//! it is set, such a call returns [`Rejected::NoDefaultStore`] without
//! running its body.
//!
//! # A call that is dropped
//! Once the body has started, dropping the call's future never frees the
//! key early: the body may already have had its effect (a statement sent to
//! the database commits anyway), and the retry must not run it again.
//!
//! - [`run_once`](Guarded::run_once) (what the attribute expands to: the
//!   body borrows `&self` and the arguments, so it cannot outlive the call)
//!   stops with the dropped future, and its claim is kept until its lease
//!   ends; meanwhile a repeat gets [`Rejected::InProgress`]. Keep the lease
//!   (default 30 s) longer than a caller's retry delay, and a unique key in
//!   the database behind the body.
//! - [`run_once_detached`](Guarded::run_once_detached), for a body that owns
//!   what it uses (`'static + Send`), runs the body in a task of its own: it
//!   goes on to its end and its result is stored, so a repeat gets
//!   [`Rejected::InProgress`] while it runs, then the stored result.
//! - Window mode holds the key for the rest of the window.
//!
//! # What a guarded function returns
//! Both modes need `Result<T, E>` with `E: From<`[`Rejected`]`>`, so a
//! refusal is an ordinary error value of the function. The once mode also
//! needs `T: Serialize + DeserializeOwned` (the stored result is JSON); use
//! `Result<(), E>` when there is nothing to give back.
//!
//! # When the store fails
//! [`FailurePolicy::FailOpen`] (the default) runs the body unguarded (in
//! once mode its result is not stored): use it when something behind the
//! function (a unique key) keeps the effect single anyway.
//! [`FailurePolicy::FailClosed`] refuses with [`Rejected::Unavailable`].
//!
//! In once mode, a result the store does not take when the body ends (it
//! went away while the body ran) is tried again with backoff for up to the
//! lease, and the key is never deleted: the body's effect happened, so a
//! repeat meanwhile waits or gets [`Rejected::InProgress`], then the
//! result. If the store stays away for the whole lease, the claim ends
//! with it and a repeat runs again; `norepeat_once_completion_lost_total`
//! counts that loss, and a result whose claim the store forgot meanwhile
//! (a restart without persistence, `FLUSHALL`), which is not written back.
//!
//! # Keys
//! The store key hashes the *scope* (by default the function's module path
//! and name) with the key string, through [`KeyBuilder`], so two functions
//! using the same key template never collide and any characters are safe.
//!
//! ```
//! use norepeat::attribute::{Guarded, Rejected};
//! use norepeat::store::MemoryStore;
//!
//! #[derive(Debug, PartialEq)]
//! enum Error { Rejected(Rejected) }
//! impl From<Rejected> for Error {
//!     fn from(r: Rejected) -> Self { Error::Rejected(r) }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let store = MemoryStore::default();
//! let once = Guarded::once("billing::charge");
//! let first: Result<u32, Error> = once.run_once(&store, "order-1", async { Ok(42) }).await;
//! // The body does not run again: the stored result comes back.
//! let again: Result<u32, Error> = once.run_once(&store, "order-1", async { Ok(7) }).await;
//! assert_eq!((first, again), (Ok(42), Ok(42)));
//! # }
//! ```
//!
//! [`FingerprintGuard`]: crate::fingerprint::FingerprintGuard
//! [`ReleasePolicy::HoldOnSuccess`]: crate::fingerprint::ReleasePolicy::HoldOnSuccess

use crate::degrade::FailurePolicy;
use crate::idempotency::Abandoned;
use crate::keys::{KeyBuilder, Namespace};
use crate::store::StoreError;
use std::sync::Arc;
use std::time::Duration;

mod default_store;
mod once;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod tx;
#[cfg(not(any(feature = "postgres", feature = "sqlite")))]
mod tx_unavailable;
mod window;

pub use default_store::{AlreadySet, DefaultStore, default_store, set_default_store};
#[cfg(any(feature = "postgres", feature = "sqlite"))]
#[doc(hidden)]
pub use tx::tx_store as __tx_store;
#[cfg(not(any(feature = "postgres", feature = "sqlite")))]
#[doc(hidden)]
pub use tx_unavailable::tx_store as __tx_store;

/// Why a guarded call did not run. A guarded function's error type converts
/// from it (`E: From<Rejected>`).
///
/// Equal values say the same: two `Unavailable` are equal when their store
/// errors read the same.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Rejected {
    /// Window mode: the key was used within the window; retry after this.
    #[error("duplicate call: the same key was used within its window; retry after {retry_after:?}")]
    Duplicate {
        /// Time left in the window (whole seconds, at least 1).
        retry_after: Duration,
    },
    /// Once mode: another call with the key is running right now.
    #[error("a call with the same key is in progress")]
    InProgress,
    /// Once mode: the call that held the key was abandoned (its process
    /// died, or lost the store for a whole lease) before its result was
    /// stored: whether its body had its effect is unknown, so it is not
    /// run again (see [`Guarded::abandoned`]).
    #[error("the call that held this key was abandoned; its outcome is unknown")]
    OutcomeUnknown,
    /// The store failed and the policy fails closed; the store's error is
    /// the [`source`](std::error::Error::source) (shared, so that
    /// `Rejected` stays `Clone`).
    #[error("the guard store is unavailable: {0}")]
    Unavailable(#[source] Arc<StoreError>),
    /// Once mode: a stored result is there but cannot be read as this
    /// function's result type (the type changed since it was stored).
    #[error("the stored result of this key cannot be read: {0}")]
    Unreadable(String),
    /// The attribute names no `store = ...` and no process-wide store was
    /// set: call [`set_default_store`] at start. The body did not run
    /// (whatever the failure policy: this is a mistake in the program, not
    /// an outage).
    #[error(
        "no store: this guarded function names no `store = ...` and none was set; call `norepeat::attribute::set_default_store(store)` at start"
    )]
    NoDefaultStore,
}

impl PartialEq for Rejected {
    fn eq(&self, other: &Self) -> bool {
        // One arm per variant of `self` (no catch-all): a new variant
        // cannot compile without saying when it is equal.
        match self {
            Rejected::Duplicate { retry_after: a } => {
                matches!(other, Rejected::Duplicate { retry_after: b } if a == b)
            }
            Rejected::InProgress => matches!(other, Rejected::InProgress),
            Rejected::OutcomeUnknown => matches!(other, Rejected::OutcomeUnknown),
            Rejected::NoDefaultStore => matches!(other, Rejected::NoDefaultStore),
            Rejected::Unavailable(a) => {
                matches!(other, Rejected::Unavailable(b) if a.to_string() == b.to_string())
            }
            Rejected::Unreadable(a) => matches!(other, Rejected::Unreadable(b) if a == b),
        }
    }
}

impl Eq for Rejected {}

impl From<StoreError> for Rejected {
    fn from(e: StoreError) -> Self {
        Rejected::Unavailable(Arc::new(e))
    }
}

/// Which mode a [`Guarded`] runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GuardMode {
    /// Refuse repeats within a window.
    Window(Duration),
    /// Run once per key and give later calls the stored result.
    Once {
        /// How long the stored result is kept.
        retention: Duration,
        /// How long a claim lives without renewal (after a crash, the time
        /// before the key can run again).
        lease: Duration,
    },
}

/// One guarded call site: scope, mode and failure policy. Cheap to build
/// (no allocation); the attribute builds one per call.
#[derive(Debug, Clone)]
pub struct Guarded {
    scope: &'static str,
    mode: GuardMode,
    failure: FailurePolicy,
    keys: KeyBuilder,
    wait: Duration,
    /// `None`: the mode's default (an unknown outcome; retried where the
    /// effect commits with the result, `run_once_in_tx`).
    abandoned: Option<Abandoned>,
}

/// Default window: 3 s.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(3);
/// Default retention of a stored result: 24 h.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// Default lease of an in-progress claim: 30 s (renewed while the body runs).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

impl Guarded {
    /// Window mode: repeats within `window` are refused.
    #[must_use]
    pub fn window(scope: &'static str, window: Duration) -> Self {
        Self {
            scope,
            mode: GuardMode::Window(window.max(Duration::from_millis(1))),
            failure: FailurePolicy::FailOpen,
            keys: KeyBuilder::default(),
            wait: Duration::ZERO,
            abandoned: None,
        }
    }

    /// Once mode, with the default retention (24 h) and lease (30 s).
    #[must_use]
    pub fn once(scope: &'static str) -> Self {
        Self {
            scope,
            mode: GuardMode::Once {
                retention: DEFAULT_RETENTION,
                lease: DEFAULT_LEASE,
            },
            failure: FailurePolicy::FailOpen,
            keys: KeyBuilder::default(),
            wait: Duration::ZERO,
            abandoned: None,
        }
    }

    /// Once mode: how long a stored result is kept (and repeats answered
    /// from it). No effect in window mode.
    #[must_use]
    pub fn retention(mut self, d: Duration) -> Self {
        if let GuardMode::Once { retention, .. } = &mut self.mode {
            *retention = d.max(Duration::from_millis(1));
        }
        self
    }

    /// Once mode: how long a claim lasts without renewal. Its deadline is
    /// inside the stored claim and moved every third of it while the body
    /// runs; a claim whose deadline passed was abandoned (its process died):
    /// see [`abandoned`](Self::abandoned). No effect in window mode.
    #[must_use]
    pub fn lease(mut self, d: Duration) -> Self {
        if let GuardMode::Once { lease, .. } = &mut self.mode {
            *lease = d.max(Duration::from_millis(3));
        }
        self
    }

    /// Once mode: what a call does with a claim whose owner is gone (its
    /// lease passed with no renewal and no result stored: the process was
    /// killed mid-body). Default [`Abandoned::OutcomeUnknown`] (but
    /// [`Abandoned::Retry`] for [`run_once_in_tx`](Self::run_once_in_tx),
    /// whose body's writes commit with its result: an abandoned call there
    /// ran no effect): the body may
    /// have had its effect, so every later call gets
    /// [`Rejected::OutcomeUnknown`] until the retention ends, and the body
    /// never runs again for that key. [`Abandoned::Retry`]: one later call
    /// takes the claim over and runs the body again (for a body whose
    /// effect commits with its result, `tx = ...`, or that checks for an
    /// earlier attempt itself). No effect in window mode.
    ///
    /// ```
    /// use norepeat::attribute::Guarded;
    /// use norepeat::idempotency::Abandoned;
    /// let once = Guarded::once("mail::send").abandoned(Abandoned::Retry);
    /// # let _ = once;
    /// ```
    #[must_use]
    pub fn abandoned(mut self, abandoned: Abandoned) -> Self {
        self.abandoned = Some(abandoned);
        self
    }

    /// Once mode: how long a call that finds the key in progress waits for
    /// the running call's result (default zero: it gets
    /// [`Rejected::InProgress`] at once). While it waits it looks again with
    /// backoff (5 ms doubling up to 100 ms): once the result is stored it
    /// gets it, without running the body; if the running call failed and
    /// freed the key, it takes the key and runs the body itself; when the
    /// wait is over, [`Rejected::InProgress`]. No effect in window mode
    /// (a repeat there is refused, not answered). The pauses are
    /// `tokio::time::sleep`: a waiting call needs a Tokio runtime with its
    /// timer, as `#[tokio::main]` sets up.
    ///
    /// ```
    /// use norepeat::attribute::{Guarded, Rejected};
    /// use norepeat::store::MemoryStore;
    /// use std::time::Duration;
    /// # #[derive(Debug, PartialEq)] struct E;
    /// # impl From<Rejected> for E { fn from(_: Rejected) -> Self { E } }
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let store = MemoryStore::default();
    /// let once = Guarded::once("mail::send").wait(Duration::from_secs(2));
    /// let slow = async {
    ///     tokio::time::sleep(Duration::from_millis(50)).await;
    ///     Ok::<u32, E>(1)
    /// };
    /// let (first, second) = tokio::join!(
    ///     once.run_once(&store, "m-1", slow),
    ///     // Starts while the first runs: waits, then gets its result.
    ///     once.run_once(&store, "m-1", async { Ok::<u32, E>(2) }),
    /// );
    /// assert_eq!((first, second), (Ok(1), Ok(1)));
    /// # }
    /// ```
    #[must_use]
    pub fn wait(mut self, d: Duration) -> Self {
        self.wait = d;
        self
    }

    /// What to do when the store fails (default fail-open).
    #[must_use]
    pub fn on_store_failure(mut self, policy: FailurePolicy) -> Self {
        self.failure = policy;
        self
    }

    /// The key prefix (default `nr`).
    #[must_use]
    pub fn keys(mut self, keys: KeyBuilder) -> Self {
        self.keys = keys;
        self
    }

    /// The mode.
    #[must_use]
    pub fn mode(&self) -> GuardMode {
        self.mode
    }

    /// The store key of `key` in this scope and mode.
    #[must_use]
    pub fn store_key(&self, key: &str) -> String {
        match self.mode {
            GuardMode::Window(_) => self
                .keys
                .key_for_digest(Namespace::Fingerprint, &self.fingerprint(key).0),
            GuardMode::Once { .. } => self.keys.key(
                Namespace::Idempotency,
                &[b"norepeat::once", self.scope.as_bytes(), key.as_bytes()],
            ),
        }
    }

    /// `(retention, lease)` of once mode (a window mode guard uses its
    /// window for both).
    fn times(&self) -> (Duration, Duration) {
        match self.mode {
            GuardMode::Once { retention, lease } => (retention, lease),
            GuardMode::Window(w) => (w, w),
        }
    }
}

// The attribute's duration grammar: one file, compiled into the macros
// crate too (this is a symlink to `norepeat-macros/src/duration.rs`).
mod duration;

/// Parses a duration as the attribute writes it: a whole number and a unit,
/// `ms`, `s`, `m` (or `min`), `h` or `d` (`"500ms"`, `"3s"`, `"24h"`), with
/// any whitespace around either; zero is not a duration. The attribute's
/// `window`, `retention`, `lease` and `wait` accept the same strings: both
/// run one grammar.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(norepeat::attribute::parse_duration("3s"), Some(Duration::from_secs(3)));
/// assert_eq!(norepeat::attribute::parse_duration("2 min"), Some(Duration::from_secs(120)));
/// assert_eq!(norepeat::attribute::parse_duration("3 parsecs"), None);
/// assert_eq!(norepeat::attribute::parse_duration("0s"), None);
/// ```
#[must_use]
pub fn parse_duration(s: &str) -> Option<Duration> {
    duration::parse_ms(s).ok().map(Duration::from_millis)
}

#[cfg(test)]
mod parse_duration_tests {
    use super::{Duration, duration, parse_duration};

    #[test]
    fn it_accepts_what_the_attribute_accepts() {
        for (s, want) in duration::CASES {
            assert_eq!(
                parse_duration(s),
                want.ok().map(Duration::from_millis),
                "{s:?}"
            );
        }
    }
}

#[cfg(test)]
mod rejected_tests {
    use super::{Duration, Rejected, StoreError};
    use std::sync::Arc;

    #[test]
    fn rejections_are_equal_exactly_when_they_say_the_same() {
        let second = || Rejected::Duplicate {
            retry_after: Duration::from_secs(1),
        };
        let down = |why: &str| Rejected::Unavailable(Arc::new(StoreError::Connection(why.into())));
        let all = [
            second(),
            Rejected::Duplicate {
                retry_after: Duration::from_secs(2),
            },
            Rejected::InProgress,
            down("refused"),
            down("reset"),
            Rejected::Unreadable("a".into()),
            Rejected::Unreadable("b".into()),
            Rejected::NoDefaultStore,
        ];
        for (i, a) in all.iter().enumerate() {
            for (j, b) in all.iter().enumerate() {
                assert_eq!(a == b, i == j, "{a:?} == {b:?}");
            }
        }
        // Equal by what they say, not by identity.
        assert_eq!(second(), second());
        assert_eq!(down("refused"), down("refused"));
    }
}
