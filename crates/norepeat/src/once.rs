//! What [`#[norepeat::guard]`](macro@crate::guard) expands to: guard one call of any
//! async function, by a key built from its arguments.
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
//! # Keys
//! The store key hashes the *scope* (by default the function's module path
//! and name) with the key string, through [`KeyBuilder`], so two functions
//! using the same key template never collide and any characters are safe.
//!
//! ```
//! use norepeat::once::{Guarded, Rejected};
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
//! [`FingerprintGuard`]: crate::guard::FingerprintGuard
//! [`ReleasePolicy::HoldOnSuccess`]: crate::guard::ReleasePolicy::HoldOnSuccess

use crate::degrade::FailurePolicy;
use crate::fingerprint::Fingerprint;
use crate::guard::{FingerprintGuard, ReleasePolicy};
use crate::keys::{KeyBuilder, Mode};
use crate::lease::{Acquired, Claim, Renewal};
use crate::problem::Code;
use crate::store::{
    KeyOp, KeyReply, KeyValueStore, RateDecision, RateOp, RateStore, Store, StoreError,
};
use futures_util::future::BoxFuture;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::future::Future;
use std::time::Duration;

/// Why a guarded call did not run. A guarded function's error type converts
/// from it (`E: From<Rejected>`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
    /// The store failed and the policy fails closed.
    #[error("the guard store is unavailable: {0}")]
    Unavailable(String),
    /// Once mode: a stored result is there but cannot be read as this
    /// function's result type (the type changed since it was stored).
    #[error("the stored result of this key cannot be read: {0}")]
    Unreadable(String),
    /// The attribute names no `store = ...` and no process-wide store was
    /// set: call [`set_default_store`] at start. The body did not run
    /// (whatever the failure policy: this is a mistake in the program, not
    /// an outage).
    #[error(
        "no store: this guarded function names no `store = ...` and none was set; call `norepeat::once::set_default_store(store)` at start"
    )]
    NoDefaultStore,
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
}

/// Default window: 3 s.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(3);
/// Default retention of a stored result: 24 h.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// Default lease of an in-progress claim: 30 s (renewed while the body runs).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The longest pause between two looks at a running call's claim while
/// waiting for its result.
const MAX_POLL: Duration = Duration::from_millis(100);
/// Window mode: a body running past the window keeps its key by renewal up
/// to this many windows.
const RENEW_WINDOWS: u32 = 10;

/// Tag bytes of a once-mode value: a claim in progress, or a stored result.
const CLAIM: u8 = b'P';
const DONE: u8 = b'D';

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

    /// Once mode: how long a claim lives without renewal. It is renewed every
    /// third of it while the body runs; if the process dies, the key can run
    /// again after at most this long. No effect in window mode.
    #[must_use]
    pub fn lease(mut self, d: Duration) -> Self {
        if let GuardMode::Once { lease, .. } = &mut self.mode {
            *lease = d.max(Duration::from_millis(3));
        }
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
    /// use norepeat::once::{Guarded, Rejected};
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
                .key_for_digest(Mode::Fingerprint, &self.fingerprint(key).0),
            GuardMode::Once { .. } => self.keys.key(
                Mode::Idempotency,
                &[b"norepeat::once", self.scope.as_bytes(), key.as_bytes()],
            ),
        }
    }

    fn fingerprint(&self, key: &str) -> Fingerprint {
        let mut h = blake3::Hasher::new();
        crate::keys::feed_parts(
            &mut h,
            &[b"norepeat::window", self.scope.as_bytes(), key.as_bytes()],
        );
        Fingerprint(*h.finalize().as_bytes())
    }

    fn fingerprint_guard<S: Store + Clone>(&self, store: S) -> FingerprintGuard<S> {
        let window = match self.mode {
            GuardMode::Window(w) => w,
            GuardMode::Once { lease, .. } => lease,
        };
        FingerprintGuard::new(store)
            .window(window)
            .release(ReleasePolicy::HoldOnSuccess)
            .on_store_failure(self.failure)
            .renew_up_to(window * RENEW_WINDOWS)
            .keys(self.keys.clone())
    }

    /// Window mode: runs `body` unless `key` was used within the window.
    /// (In once mode this behaves as a window of the lease's length; use
    /// [`run_once`](Self::run_once) there.)
    ///
    /// # Errors
    /// The body's error, or `E::from(`[`Rejected`]`)`: `Duplicate` within the
    /// window, `Unavailable` when the store fails and the policy fails closed.
    pub async fn run_window<S, T, E, F>(&self, store: &S, key: &str, body: F) -> Result<T, E>
    where
        S: Store + Clone,
        E: From<Rejected>,
        F: Future<Output = Result<T, E>>,
    {
        let guard = self.fingerprint_guard(store.clone());
        let lease = match guard.acquire(&self.fingerprint(key)).await {
            Ok(lease) => lease,
            Err(p) => {
                return Err(E::from(match p.code {
                    Code::GuardUnavailable => Rejected::Unavailable(p.detail.into_owned()),
                    _ => Rejected::Duplicate {
                        retry_after: Duration::from_secs(p.retry_after.unwrap_or(1)),
                    },
                }));
            }
        };
        // Renewal (up to RENEW_WINDOWS windows) lives in this future. Dropped
        // mid-body, the lease keeps its key for the rest of the window.
        let out = lease.run(body).await;
        lease.finish(out.is_ok()).await;
        out
    }

    /// Once mode: runs `body` at most once per key with success; later calls
    /// get the stored `Ok` value.
    ///
    /// # Errors
    /// The body's error (after which the key is free again), or
    /// `E::from(`[`Rejected`]`)`: `InProgress` while another call with the
    /// key runs, `Unavailable` when the store fails and the policy fails
    /// closed, `Unreadable` when the stored result does not deserialize.
    pub async fn run_once<S, T, E, F>(&self, store: &S, key: &str, body: F) -> Result<T, E>
    where
        S: Store + Clone,
        T: Serialize + DeserializeOwned,
        E: From<Rejected>,
        F: Future<Output = Result<T, E>>,
    {
        let claim = match self.claim(store, key).await {
            Ok(Claimed::Owned(claim)) => claim,
            Ok(Claimed::Done(v)) => return Ok(v),
            Ok(Claimed::Unguarded) => return body.await,
            Err(r) => return Err(E::from(r)),
        };
        // Not detachable (the body may borrow `&self` and the arguments):
        // renewal lives in this future, and a dropped call keeps its claim
        // until the lease ends.
        let (retention, lease) = self.times();
        let out = claim.run(body, Renewal::thirds(lease)).await;
        finish(claim, encode(out.as_ref().ok()), retention).await;
        out
    }

    /// Once mode, for a body that owns what it uses (`'static + Send`): like
    /// [`run_once`](Self::run_once), but the body runs in a task of its own.
    /// Once it has started it runs to its end and its result is stored even
    /// if this call's future is dropped; a later call gets that result (or
    /// [`Rejected::InProgress`] while it still runs). Needs a Tokio runtime
    /// (without one the body runs inline).
    ///
    /// # Errors
    /// As [`run_once`](Self::run_once).
    ///
    /// ```
    /// use norepeat::once::{Guarded, Rejected};
    /// use norepeat::store::MemoryStore;
    /// # #[derive(Debug, PartialEq)] struct E;
    /// # impl From<Rejected> for E { fn from(_: Rejected) -> Self { E } }
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let store = MemoryStore::default();
    /// let once = Guarded::once("points::award");
    /// let first: Result<u32, E> = once.run_once_detached(&store, "order-1", async { Ok(30) }).await;
    /// let again: Result<u32, E> = once.run_once_detached(&store, "order-1", async { Ok(99) }).await;
    /// assert_eq!((first, again), (Ok(30), Ok(30)));
    /// # }
    /// ```
    pub async fn run_once_detached<S, T, E, F>(&self, store: &S, key: &str, body: F) -> Result<T, E>
    where
        S: Store + Clone,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: From<Rejected> + Send + 'static,
        F: Future<Output = Result<T, E>> + Send + 'static,
    {
        let claim = match self.claim(store, key).await {
            Ok(Claimed::Owned(claim)) => claim,
            Ok(Claimed::Done(v)) => return Ok(v),
            Ok(Claimed::Unguarded) => return body.await,
            Err(r) => return Err(E::from(r)),
        };
        let (retention, lease) = self.times();
        crate::lease::detach(async move {
            let out = claim.run(body, Renewal::thirds(lease)).await;
            finish(claim, encode(out.as_ref().ok()), retention).await;
            out
        })
        .await
    }

    /// `(retention, lease)` of once mode (a window mode guard uses its
    /// window for both).
    fn times(&self) -> (Duration, Duration) {
        match self.mode {
            GuardMode::Once { retention, lease } => (retention, lease),
            GuardMode::Window(w) => (w, w),
        }
    }

    /// Once mode's claim: the key, or the stored result, or a refusal. A
    /// key in progress is looked at again, with backoff, for up to the
    /// wait: the call replays once the result is stored, and takes the key
    /// itself if the running call released it.
    async fn claim<S, T>(&self, store: &S, key: &str) -> Result<Claimed<S, T>, Rejected>
    where
        S: KeyValueStore + Clone,
        T: DeserializeOwned,
    {
        let (_, lease) = self.times();
        let key = self.store_key(key);
        let mut claim_value = Vec::with_capacity(17);
        claim_value.push(CLAIM);
        claim_value.extend_from_slice(format!("{:016x}", rand::random::<u64>()).as_bytes());
        let deadline = tokio::time::Instant::now() + self.wait;
        let mut pause = Duration::from_millis(5);
        loop {
            let existing = match Claim::acquire(store, key.clone(), claim_value.clone(), lease)
                .await
            {
                Ok(Acquired::Owned(claim)) => {
                    metrics::counter!("norepeat_decisions_total", "mode" => "once", "outcome" => "admitted").increment(1);
                    return Ok(Claimed::Owned(claim));
                }
                Ok(Acquired::Held(existing)) => existing,
                Err(e) => return self.on_failure(&e).map(|()| Claimed::Unguarded),
            };
            if let Some(done) = stored(&existing) {
                return done.map(Claimed::Done);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                metrics::counter!("norepeat_decisions_total", "mode" => "once", "outcome" => "rejected", "reason" => "in_progress").increment(1);
                return Err(Rejected::InProgress);
            }
            tokio::time::sleep(pause.min(deadline - now)).await;
            pause = (pause * 2).min(MAX_POLL);
        }
    }

    fn on_failure(&self, e: &StoreError) -> Result<(), Rejected> {
        match crate::guard::store_failure("once", self.failure, e) {
            Ok(()) => Ok(()),
            Err(p) => Err(Rejected::Unavailable(format!("{}: {e}", p.detail))),
        }
    }
}

/// What an existing once-mode value means for a repeat: its stored result
/// (or `Unreadable`), or `None` while a call holds it in progress.
fn stored<T: DeserializeOwned>(existing: &[u8]) -> Option<Result<T, Rejected>> {
    match existing.split_first() {
        Some((&DONE, json)) => Some(match serde_json::from_slice::<T>(json) {
            Ok(v) => {
                metrics::counter!("norepeat_decisions_total", "mode" => "once", "outcome" => "replayed").increment(1);
                Ok(v)
            }
            Err(e) => Err(Rejected::Unreadable(e.to_string())),
        }),
        _ => None,
    }
}

/// What a once-mode claim attempt found.
enum Claimed<S: KeyValueStore + Clone, T> {
    /// This call holds the key and runs the body.
    Owned(Claim<S>),
    /// The stored result of an earlier call.
    Done(T),
    /// The store failed and the policy fails open: run without a claim.
    Unguarded,
}

/// The stored form of a result: `D` and its JSON.
fn encode<T: Serialize>(ok: Option<&T>) -> Option<Result<Vec<u8>, serde_json::Error>> {
    ok.map(|v| {
        let mut out = vec![DONE];
        serde_json::to_writer(&mut out, v).map(|()| out)
    })
}

/// Stores the result (success) or releases the claim (failure).
async fn finish<S: Store + Clone>(
    claim: Claim<S>,
    done: Option<Result<Vec<u8>, serde_json::Error>>,
    retention: Duration,
) {
    match done {
        Some(Ok(done)) => {
            claim.complete(&done, retention).await;
        }
        Some(Err(e)) => {
            tracing::warn!(key = claim.key(), error = %e, "once: the result does not serialize; releasing the key");
            claim.release().await;
        }
        None => claim.release().await,
    }
}

/// Parses a duration as the attribute writes it: a whole number and a unit,
/// `ms`, `s`, `m`, `h` or `d` (`"500ms"`, `"3s"`, `"24h"`).
///
/// ```
/// use std::time::Duration;
/// assert_eq!(norepeat::once::parse_duration("3s"), Some(Duration::from_secs(3)));
/// assert_eq!(norepeat::once::parse_duration("3 parsecs"), None);
/// ```
#[must_use]
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    let ms = match unit.trim() {
        "ms" => n,
        "s" => n.checked_mul(1_000)?,
        "m" | "min" => n.checked_mul(60_000)?,
        "h" => n.checked_mul(3_600_000)?,
        "d" => n.checked_mul(86_400_000)?,
        _ => return None,
    };
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// The process-wide store of [`#[norepeat::guard]`](macro@crate::guard)
/// functions that name no `store = ...`: set once at start with
/// [`set_default_store`], read with [`default_store`].
///
/// It holds any [`Store`] behind an `Arc` (cloning it is cheap); each call
/// goes through one boxed future, a small price next to a store's round
/// trip. It is a [`Store`] itself, so [`Guarded`] can use it without the
/// attribute.
#[derive(Clone)]
pub struct DefaultStore(std::sync::Arc<dyn ErasedStore>);

impl std::fmt::Debug for DefaultStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("DefaultStore").field(&self.0.kind()).finish()
    }
}

static DEFAULT_STORE: std::sync::OnceLock<DefaultStore> = std::sync::OnceLock::new();

/// [`set_default_store`] was called before: the process-wide store is set
/// once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the process-wide norepeat store is already set: set it once, at start")]
pub struct AlreadySet;

/// Sets the store used by every [`#[norepeat::guard]`](macro@crate::guard)
/// function that names no `store = ...`, for the life of the process. Call
/// it once, at start, before the first guarded call; until then such a call
/// returns `Err(E::from(`[`Rejected::NoDefaultStore`]`))` without running
/// its body.
///
/// A function with `store = ...` keeps using its own store. Wrap the store
/// first if it needs to survive outages
/// ([`Resilient`](crate::degrade::Resilient)).
///
/// # Errors
/// [`AlreadySet`] when a store was set before (the first one stays).
///
/// ```
/// use norepeat::once::Rejected;
/// use norepeat::store::MemoryStore;
///
/// #[derive(Debug)]
/// struct Failed;
/// impl From<Rejected> for Failed {
///     fn from(_: Rejected) -> Self { Failed }
/// }
///
/// // No `store = ...`: the process-wide store.
/// #[norepeat::guard(key = "{order_id}", mode = once)]
/// async fn ship(order_id: u64) -> Result<u64, Failed> {
///     Ok(order_id)
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), norepeat::once::AlreadySet> {
/// norepeat::once::set_default_store(MemoryStore::default())?;
/// assert_eq!(ship(7).await.unwrap(), 7);
/// # Ok(()) }
/// ```
pub fn set_default_store<S: Store>(store: S) -> Result<(), AlreadySet> {
    DEFAULT_STORE
        .set(DefaultStore(std::sync::Arc::new(store)))
        .map_err(|_| AlreadySet)
}

/// The process-wide store set by [`set_default_store`] (what a guarded
/// function without `store = ...` uses).
///
/// # Errors
/// [`Rejected::NoDefaultStore`] when none was set.
pub fn default_store() -> Result<DefaultStore, Rejected> {
    DEFAULT_STORE.get().cloned().ok_or(Rejected::NoDefaultStore)
}

/// [`Store`] as an object: each method returns a boxed future.
trait ErasedStore: Send + Sync + 'static {
    fn execute<'a>(&'a self, op: KeyOp<'a>) -> BoxFuture<'a, Result<KeyReply, StoreError>>;
    fn rate<'a>(&'a self, op: RateOp<'a>) -> BoxFuture<'a, Result<RateDecision, StoreError>>;
    fn kind(&self) -> &'static str;
    fn reconnect(&self);
}

impl<S: Store> ErasedStore for S {
    fn execute<'a>(&'a self, op: KeyOp<'a>) -> BoxFuture<'a, Result<KeyReply, StoreError>> {
        Box::pin(KeyValueStore::execute(self, op))
    }
    fn rate<'a>(&'a self, op: RateOp<'a>) -> BoxFuture<'a, Result<RateDecision, StoreError>> {
        Box::pin(RateStore::rate(self, op))
    }
    fn kind(&self) -> &'static str {
        KeyValueStore::kind(self)
    }
    fn reconnect(&self) {
        KeyValueStore::reconnect(self);
    }
}

impl KeyValueStore for DefaultStore {
    async fn execute(&self, op: KeyOp<'_>) -> Result<KeyReply, StoreError> {
        self.0.execute(op).await
    }
    fn kind(&self) -> &'static str {
        self.0.kind()
    }
    fn reconnect(&self) {
        self.0.reconnect();
    }
}

impl RateStore for DefaultStore {
    async fn rate(&self, op: RateOp<'_>) -> Result<RateDecision, StoreError> {
        self.0.rate(op).await
    }
}

/// Once mode with the body's writes and the stored result in one database
/// transaction: a message consumer that awards points and records the
/// message together.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl Guarded {
    /// Once mode on a SQL store ([`PgStore`](crate::store::PgStore),
    /// [`SqliteStore`](crate::store::SqliteStore)): claims the key, opens a
    /// transaction on the store's pool and hands it to `body`, which makes
    /// its writes and gives the transaction back with its result. The
    /// stored result is then written in that transaction, owner-checked
    /// (the claim must still be this call's), and one `COMMIT` makes the
    /// writes and the record durable together. A crash or a dropped future
    /// before the commit leaves no writes and the claim open (the lease
    /// frees it; the next delivery runs once); after it, both.
    ///
    /// # Errors
    /// The body's error (its transaction is dropped, so rolled back, and
    /// the key is free again), or `E::from(`[`Rejected`]`)`: `InProgress`
    /// while another call holds the key, or when this call's claim was lost
    /// before the commit (its writes were rolled back; the other call's
    /// result stands); `Unavailable` when the database fails (the claim is
    /// released; if `COMMIT` itself failed, the writes and the record share
    /// its fate); `Unreadable` as in [`run_once`](Self::run_once).
    ///
    /// ```
    /// use norepeat::once::{Guarded, Rejected};
    /// use norepeat::store::SqliteStore;
    /// # #[derive(Debug)] struct E;
    /// # impl From<Rejected> for E { fn from(_: Rejected) -> Self { E } }
    /// # impl From<sqlx::Error> for E { fn from(_: sqlx::Error) -> Self { E } }
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), E> {
    /// let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await?;
    /// sqlx::query("CREATE TABLE points (user_id TEXT, n INTEGER)").execute(&pool).await?;
    /// let store = SqliteStore::new(pool.clone());
    /// store.migrate().await.map_err(|_| E)?;
    /// let once = Guarded::once("points::award");
    /// for _delivery in 0..3 {
    ///     let awarded: i64 = once
    ///         .run_once_in_tx(&store, "order-7", |mut tx| async move {
    ///             sqlx::query("INSERT INTO points VALUES ('u1', 30)").execute(&mut *tx).await?;
    ///             Ok::<_, E>((tx, 30))
    ///         })
    ///         .await?;
    ///     assert_eq!(awarded, 30);
    /// }
    /// let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM points").fetch_one(&pool).await?;
    /// assert_eq!(rows, 1);
    /// # Ok(()) }
    /// ```
    pub async fn run_once_in_tx<S, T, E, F, Fut>(
        &self,
        store: &S,
        key: &str,
        body: F,
    ) -> Result<T, E>
    where
        S: crate::store::sql::TxStore,
        T: Serialize + DeserializeOwned,
        E: From<Rejected>,
        F: FnOnce(sqlx::Transaction<'static, S::Database>) -> Fut,
        Fut: Future<Output = Result<(sqlx::Transaction<'static, S::Database>, T), E>>,
    {
        let (retention, lease) = self.times();
        let claim = match self.claim::<S, T>(store, key).await.map_err(E::from)? {
            Claimed::Owned(claim) => claim,
            Claimed::Done(v) => return Ok(v),
            Claimed::Unguarded => {
                // Fail open: run unguarded, committing the body's writes.
                let tx = store
                    .begin_tx()
                    .await
                    .map_err(|e| E::from(Rejected::Unavailable(e.to_string())))?;
                let (tx, v) = body(tx).await?;
                store
                    .commit_tx(tx)
                    .await
                    .map_err(|e| E::from(Rejected::Unavailable(e.to_string())))?;
                return Ok(v);
            }
        };
        let unavailable = |e: StoreError| E::from(Rejected::Unavailable(e.to_string()));
        let work = async {
            let tx = store.begin_tx().await.map_err(unavailable)?;
            body(tx).await
        };
        let (mut tx, v) = match claim.run(work, Renewal::thirds(lease)).await {
            Ok(out) => out,
            Err(e) => {
                claim.release().await;
                return Err(e);
            }
        };
        let Some(Ok(done)) = encode(Some(&v)) else {
            tracing::warn!(
                key = claim.key(),
                "once: the result does not serialize; rolling back"
            );
            drop(tx);
            claim.release().await;
            return Err(E::from(Rejected::Unreadable(
                "the result does not serialize".into(),
            )));
        };
        match store
            .replace_in_tx(&mut tx, claim.key(), claim.value(), &done, retention)
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(
                    key = claim.key(),
                    "once: claim lost before commit; rolled back"
                );
                drop(tx);
                claim.keep();
                return Err(E::from(Rejected::InProgress));
            }
            Err(e) => {
                drop(tx);
                claim.release().await;
                return Err(unavailable(e));
            }
        }
        match store.commit_tx(tx).await {
            Ok(()) => {
                claim.keep();
                Ok(v)
            }
            Err(e) => {
                // Owner-checked: frees the key only if the commit did not
                // happen (the record would no longer be our claim).
                claim.release().await;
                Err(unavailable(e))
            }
        }
    }
}
