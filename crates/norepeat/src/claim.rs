// Over 400 lines on purpose: one claim life cycle with its cancellation rules; 90 lines are tests.
//! One claim life cycle, shared by every guard: claim, run with
//! owner-checked renewal, then complete or release.
//!
//! The fingerprint guard ([`crate::fingerprint`]), idempotency
//! ([`crate::idempotency`]) and the attribute runtime ([`crate::attribute`]) all
//! hold their key through a [`Claim`]:
//!
//! 1. **Claim**: `put_if_absent(key, value, ttl)`. The value is unique per
//!    claim; its exact bytes are the proof of ownership for every later
//!    change.
//! 2. **Run** the protected work under [`Claim::run`], which renews the key
//!    (`expire_if_equals`) every so often while the work runs. Renewal lives
//!    in that future: it stops the moment the future ends or is dropped, so
//!    a dead or abandoned caller never keeps a key past its TTL. A renewal
//!    runs beside the work, never in its way (the work is polled while a
//!    renewal waits), and has a budget of one renewal interval.
//! 3. **Complete** (`replace_if_equals`, the fence against a lost claim),
//!    **release** (`delete_if_equals`), or **keep** (the key expires with its
//!    TTL).
//!
//! # Cancellation
//! Once the protected work has started, dropping the caller's future never
//! frees the claim early: a dropped [`Claim`] does nothing, and its key ends
//! with its TTL. The work may have had an effect before it was dropped (a
//! statement already sent to the database commits anyway), so a retry must
//! not run it a second time. Only a panic (the work certainly stopped, and
//! failed) releases the key at once, as an error does.
//!
//! Where the work can be detached (`'static + Send`), the guards carry it to
//! completion in a task of its own ([`detach`]), and the result is stored
//! whatever the caller does.

mod fence;
mod renewer;

pub(crate) use fence::{Fence, Restamp, passed, stamp};
pub(crate) use renewer::Renewer;

use crate::store::KeyValueStoreExt;
use crate::store::{DecidedBy, KeyValueStore, StoreError};
use crate::store::{put_if_absent_decided, replace_if_equals_decided};
use bytes::Bytes;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The longest interval a timer is armed for: a renewal interval or a
/// total hold past it (a lease of `Duration::MAX`) is this long, so that
/// adding it to an instant never overflows.
pub(crate) const FOREVER: Duration = Duration::from_secs(100 * 365 * 86_400);

/// How a running claim is renewed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Renewal {
    /// Interval between two renewals (zero: no renewal).
    pub(crate) every: Duration,
    /// Renewal stops once `elapsed + ttl` would pass this total hold.
    pub(crate) max: Duration,
}

impl Renewal {
    /// Renew every third of `ttl`, without limit.
    pub(crate) fn thirds(ttl: Duration) -> Self {
        Self {
            every: ttl / 3,
            max: Duration::MAX,
        }
    }

    /// No renewal: a work slower than the TTL loses its key.
    pub(crate) fn none() -> Self {
        Self {
            every: Duration::ZERO,
            max: Duration::ZERO,
        }
    }

    /// Renew every third of `ttl` up to a total hold of `max`.
    pub(crate) fn up_to(ttl: Duration, max: Duration) -> Self {
        if max.is_zero() {
            return Self::none();
        }
        Self {
            every: ttl / 3,
            max,
        }
    }
}

/// The outcome of a claim attempt.
pub(crate) enum Claimed<S: KeyValueStore + Clone> {
    /// This caller holds the key.
    Owned(Claim<S>),
    /// Someone else does; their value, unchanged.
    Held(Bytes),
}

/// What [`Claim::try_complete`] or [`Claim::complete_retrying`] achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Completion {
    /// The result replaced the claim.
    Stored,
    /// The claim was lost (expired, and maybe taken by another): the other
    /// owner's record is left alone.
    Lost,
    /// The store failed and stayed away while
    /// [`complete_retrying`](Claim::complete_retrying) tried: the claim was
    /// left as it is and ends with its TTL.
    Expiring,
}

/// The first pause between two tries of a completion that failed.
const FIRST_RETRY: Duration = Duration::from_millis(20);
/// The longest pause between two tries of a completion that failed.
const MAX_RETRY: Duration = Duration::from_secs(1);

/// A held key. See the [module docs](self) for what dropping it does.
#[derive(Debug)]
pub(crate) struct Claim<S: KeyValueStore + Clone> {
    store: S,
    key: Arc<str>,
    /// The value the key holds for this claim (it changes with each
    /// renewal of a stamped claim).
    fence: Arc<Fence>,
    /// The key's time to live, set at each renewal.
    ttl: Duration,
    /// How long the claim lasts unrenewed: its TTL, or for a stamped claim
    /// the deadline in its value (renewal runs every third of it).
    lease: Duration,
    settled: bool,
    /// Taken from the local memory of a store that failed
    /// ([`DecidedBy::LocalMemory`]), not from the store.
    local: bool,
}

/// How a claim's value carries its lease (see [`Claim::acquire_stamped`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stamped {
    /// Rewrites the value with a new deadline.
    pub(crate) restamp: Restamp,
    /// The lease a claim or renewal grants.
    pub(crate) lease: Duration,
}

impl<S: KeyValueStore + Clone> Claim<S> {
    /// Takes `key` for `ttl` with `value`, or learns who holds it.
    /// `key` and `value` are kept as given when the claim is won: pass an
    /// `Arc<str>` and `Bytes` to try the same claim again without copies.
    /// The claim's lease is its TTL: renewal extends it.
    pub(crate) async fn acquire(
        store: &S,
        key: impl Into<Arc<str>>,
        value: impl Into<Bytes>,
        ttl: Duration,
    ) -> Result<Claimed<S>, StoreError> {
        let (key, value) = (key.into(), value.into());
        let (held, by) = put_if_absent_decided(store, &key, &value, ttl).await?;
        Ok(match held {
            None => {
                let fence = Fence::fixed(value, ttl);
                Claimed::Owned(Self::owned(store, key, fence, ttl, ttl).decided_by(by))
            }
            Some(existing) => Claimed::Held(existing),
        })
    }

    /// Takes `key` for `ttl` with `value`, a value that carries its own
    /// lease deadline (`stamped.lease` from now), or learns who holds it.
    /// The record outlives its lease (`ttl`, the retention): renewal
    /// rewrites the value with a later deadline, so a reader can tell a
    /// live claim from one whose owner is gone.
    pub(crate) async fn acquire_stamped(
        store: &S,
        key: Arc<str>,
        value: Bytes,
        ttl: Duration,
        stamped: Stamped,
    ) -> Result<Claimed<S>, StoreError> {
        let (held, by) = put_if_absent_decided(store, &key, &value, ttl).await?;
        Ok(match held {
            None => Claimed::Owned(Self::stamped(store, key, value, ttl, stamped).decided_by(by)),
            Some(existing) => Claimed::Held(existing),
        })
    }

    /// Takes over `key` from the abandoned claim whose value is `held`
    /// (one compare-and-set), writing `value` (a stamped value, as for
    /// [`acquire_stamped`](Self::acquire_stamped)). `None` when the key no
    /// longer holds `held`: someone else changed it first.
    pub(crate) async fn take_over(
        store: &S,
        key: Arc<str>,
        held: &[u8],
        value: Bytes,
        ttl: Duration,
        stamped: Stamped,
    ) -> Result<Option<Self>, StoreError> {
        let (done, by) = replace_if_equals_decided(store, &key, held, &value, ttl).await?;
        Ok(done.then(|| Self::stamped(store, key, value, ttl, stamped).decided_by(by)))
    }

    fn stamped(store: &S, key: Arc<str>, value: Bytes, ttl: Duration, s: Stamped) -> Self {
        let fence = Fence::stamped(value, s.restamp, s.lease);
        Self::owned(store, key, fence, ttl, s.lease)
    }

    fn owned(store: &S, key: Arc<str>, fence: Arc<Fence>, ttl: Duration, lease: Duration) -> Self {
        Self {
            store: store.clone(),
            key,
            fence,
            ttl,
            lease,
            settled: false,
            local: false,
        }
    }

    fn decided_by(mut self, by: DecidedBy) -> Self {
        self.local = by == DecidedBy::LocalMemory;
        self
    }

    /// Whether the claim was taken from the local memory of a store that
    /// failed (see [`DecidedLocally`](crate::degrade::DecidedLocally)).
    pub(crate) fn decided_locally(&self) -> bool {
        self.local
    }

    /// The store key.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// The store key, shared (an `Arc` clone).
    pub(crate) fn shared_key(&self) -> Arc<str> {
        Arc::clone(&self.key)
    }

    /// The claim's value, shared: the proof of ownership for an
    /// owner-checked change made outside this type (a completion inside a
    /// transaction), to be used under [`Fence::lock`].
    pub(crate) fn fence(&self) -> Arc<Fence> {
        Arc::clone(&self.fence)
    }

    /// Extends the claim to a full lease from now, if it still owns its key.
    pub(crate) async fn renew(&self) -> Result<bool, StoreError> {
        let renewed = self
            .fence
            .renew(&self.store, &self.key, self.ttl, true)
            .await?;
        metrics::counter!("norepeat_lease_renewals_total", "renewed" => if renewed { "yes" } else { "lost" }).increment(1);
        Ok(renewed)
    }

    /// Drives `work` to its end while `renewer`'s task renews the key per
    /// `renewal`: this future only registers the claim and removes it when
    /// it ends or is dropped, so renewal stops with it. Without a Tokio
    /// runtime, as [`run`](Self::run).
    ///
    /// Work that ends at its first poll (a handler that answers at once, a
    /// response body already in memory) is not registered: it needs no
    /// renewal, and registering costs two turns of the renewer's lock and a
    /// clock read. So a first poll that blocks its thread (synchronous code
    /// before the first `.await`) is not renewed while it blocks.
    pub(crate) async fn run_renewed_by<F: Future>(
        &self,
        renewer: &Renewer<S>,
        work: F,
        renewal: Renewal,
    ) -> F::Output {
        if renewal.every.is_zero() || self.lease >= renewal.max {
            return work.await;
        }
        let mut work = std::pin::pin!(work);
        // Registered when the work first waits, in the same poll (the work
        // is polled once per wake-up, never twice in a row for this).
        let mut registration = None;
        let mut first = true;
        let done = std::future::poll_fn(|cx| {
            let out = work.as_mut().poll(cx).map(Some);
            if out.is_pending() && std::mem::take(&mut first) {
                registration = renewer.register(
                    Arc::clone(&self.key),
                    Arc::clone(&self.fence),
                    (self.ttl, self.lease),
                    renewal.every,
                    renewal.max,
                );
                if registration.is_none() {
                    // No runtime for the renewer's task: renew here.
                    return std::task::Poll::Ready(None);
                }
            }
            out
        })
        .await;
        match done {
            Some(out) => {
                drop(registration);
                out
            }
            None => self.run(work, renewal).await,
        }
    }

    /// Drives `work` to its end, renewing the key per `renewal` while it
    /// runs, with a timer of its own. No task is spawned: renewal stops
    /// with this future.
    ///
    /// The work and the renewals are polled side by side: a renewal in
    /// flight never pauses the work. (A renewal on a one-connection SQL
    /// pool whose connection the work holds in a transaction waits for
    /// that connection; were the work paused meanwhile, neither would move
    /// until the lease was lost.) Each renewal has a time budget of one
    /// interval; one that runs out of it is abandoned and the next is tried
    /// at the next interval.
    pub(crate) async fn run<F: Future>(&self, work: F, renewal: Renewal) -> F::Output {
        if renewal.every.is_zero() {
            return work.await;
        }
        let renewals = self.renew_while_held(renewal);
        tokio::pin!(work, renewals);
        // The work first: most finish before the first renewal is due.
        match futures_util::future::select(work, renewals).await {
            futures_util::future::Either::Left((out, _)) => out,
            futures_util::future::Either::Right((never, _)) => match never {},
        }
    }

    /// Renews the key every `renewal.every` until the total hold is reached
    /// or the claim is lost, then waits forever: a future to race against
    /// the work, never to await alone.
    async fn renew_while_held(&self, renewal: Renewal) -> std::convert::Infallible {
        let every = renewal.every.clamp(Duration::from_millis(1), FOREVER);
        let started = Instant::now();
        let mut tick = tokio::time::interval_at(started + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if started.elapsed().saturating_add(self.lease) > renewal.max {
                break;
            }
            match tokio::time::timeout(every, self.renew()).await {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => {
                    tracing::warn!(key = &*self.key, "claim lost while its work runs");
                    break;
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "claim renewal failed; will retry"),
                Err(_) => tracing::debug!(
                    key = &*self.key,
                    "claim renewal ran out of its time budget; will retry"
                ),
            }
        }
        std::future::pending().await
    }

    /// Replaces the claim with `done` for `retention`, owner-checked, once.
    /// On a store failure the claim is handed back untouched, for
    /// [`complete_retrying`](Self::complete_retrying): nothing is deleted.
    pub(crate) async fn try_complete(
        mut self,
        done: &[u8],
        retention: Duration,
    ) -> Result<Completion, Self> {
        match self.replace_with(done, retention).await {
            Ok(true) => {
                self.settled = true;
                Ok(Completion::Stored)
            }
            Ok(false) => {
                self.settled = true;
                tracing::warn!(
                    key = &*self.key,
                    "claim lost before its work completed; result not stored"
                );
                Ok(Completion::Lost)
            }
            Err(e) => {
                tracing::debug!(key = &*self.key, error = %e, "could not store a result; will try again");
                Err(self)
            }
        }
    }

    /// Replaces the claim with `done` for `retention`, owner-checked; when
    /// the store fails, keeps trying (with [`complete_retrying`](Self::complete_retrying),
    /// for up to `within`) in a task of its own, tracked by `tracker` when
    /// given (without a runtime, here), so the caller goes on at once. The
    /// key is never deleted: the work has had its effect. `outcome` is told
    /// what became of the result.
    pub(crate) async fn complete_or_keep_trying(
        self,
        done: Vec<u8>,
        retention: Duration,
        within: Duration,
        tracker: Option<&tokio_util::task::TaskTracker>,
        outcome: fn(Completion),
    ) {
        let claim = match self.try_complete(&done, retention).await {
            Ok(o) => return outcome(o),
            Err(claim) => claim,
        };
        let retry = async move { outcome(claim.complete_retrying(&done, retention, within).await) };
        match (tokio::runtime::Handle::try_current(), tracker) {
            (Ok(rt), Some(tracker)) => drop(tracker.spawn_on(retry, &rt)),
            (Ok(rt), None) => drop(rt.spawn(retry)),
            (Err(_), _) => retry.await,
        }
    }

    /// Tries again, after [`try_complete`](Self::try_complete) failed, to
    /// replace the claim with `done`: with backoff (20 ms doubling to 1 s)
    /// for up to `within`, and never deleting the key: the work has had its
    /// effect, and a free key would let a retry run it a second time. If
    /// the store stays away the claim is left to end with its TTL
    /// ([`Completion::Expiring`]).
    ///
    /// The failed try may have landed with only its reply lost: when a
    /// later try finds the claim gone, the key is checked for `done` itself
    /// (one conditional call, `replace_if_equals(done, done)`) before the
    /// completion is called lost.
    pub(crate) async fn complete_retrying(
        mut self,
        done: &[u8],
        retention: Duration,
        within: Duration,
    ) -> Completion {
        self.settled = true;
        let deadline = Instant::now().checked_add(within);
        let mut pause = FIRST_RETRY;
        loop {
            let left = deadline.map_or(Duration::MAX, |d| {
                d.saturating_duration_since(Instant::now())
            });
            if left.is_zero() {
                tracing::warn!(
                    key = &*self.key,
                    "could not store a result while the lease lasted; the key ends with it"
                );
                return Completion::Expiring;
            }
            tokio::time::sleep(pause.min(left)).await;
            pause = (pause * 2).min(MAX_RETRY);
            let tried = match self.replace_with(done, retention).await {
                Ok(true) => Ok(true),
                Ok(false) => {
                    self.store
                        .replace_if_equals(&self.key, done, done, retention)
                        .await
                }
                Err(e) => Err(e),
            };
            match tried {
                Ok(true) => return Completion::Stored,
                Ok(false) => {
                    tracing::warn!(
                        key = &*self.key,
                        "claim lost before its work completed; result not stored"
                    );
                    return Completion::Lost;
                }
                Err(e) => {
                    tracing::debug!(key = &*self.key, error = %e, "could not store a result; trying again");
                }
            }
        }
    }

    /// Releases the key (owner-checked), so a retry runs again.
    pub(crate) async fn release(mut self) {
        self.settled = true;
        self.delete().await;
    }

    /// Releases the key by writing `mark` of the value it holds for this
    /// claim (owner-checked: one compare-and-set), where the key's next
    /// claim finds it: the idempotency guard's released record, which
    /// carries the attempt number on. A value `mark` has no spelling for
    /// is deleted, as [`release`](Self::release) does.
    pub(crate) async fn release_marked(mut self, mark: fn(&[u8]) -> Option<Vec<u8>>) {
        self.settled = true;
        let mut unmarked = false;
        {
            let values = self.fence.lock().await;
            for v in values.newest_first() {
                let Some(marked) = mark(v) else {
                    unmarked = true;
                    continue;
                };
                match self
                    .store
                    .replace_if_equals(&self.key, v, &marked, self.ttl)
                    .await
                {
                    Ok(true) => return,
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(key = &*self.key, error = %e, "could not release a key; it ends with its lease");
                        return;
                    }
                }
            }
        }
        if unmarked {
            self.delete().await;
        }
    }

    /// Leaves the key as it is: it ends with its TTL.
    pub(crate) fn keep(mut self) {
        self.settled = true;
    }

    /// Replaces the claim's value (whichever of its values the store
    /// holds) with `done` for `ttl`; whether it did.
    /// (The claim is settled after it: the fence is not told of `done`.)
    async fn replace_with(&self, done: &[u8], ttl: Duration) -> Result<bool, StoreError> {
        let values = self.fence.lock().await;
        for v in values.newest_first() {
            if self
                .store
                .replace_if_equals(&self.key, v, done, ttl)
                .await?
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    async fn delete(&self) {
        if let Err(e) = delete_owned(&self.store, &self.key, &self.fence).await {
            tracing::warn!(key = &*self.key, error = %e, "could not release a key; it expires with its TTL");
        }
    }
}

/// Deletes `key` if it holds one of `fence`'s values.
async fn delete_owned<S: KeyValueStore>(
    store: &S,
    key: &str,
    fence: &Fence,
) -> Result<bool, StoreError> {
    let values = fence.lock().await;
    for v in values.newest_first() {
        if store.delete_if_equals(key, v).await? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The pauses before each try of [`take_back`]: at once, then at about
/// 0.1, 0.4, 1, 2, 4, 8 and 16 s, and 31 s after the failure.
const TAKE_BACK_PAUSES: [Duration; 9] = [
    Duration::ZERO,
    Duration::from_millis(100),
    Duration::from_millis(300),
    Duration::from_millis(600),
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
    Duration::from_secs(15),
];

/// At most this many take-backs wait at once, in the whole process. Each
/// is a task of a few hundred bytes that may live half a minute: a busy
/// fail-closed route during an outage (5,000 refusals a second) would
/// otherwise hold some 150,000 of them. One past the bound leaves its
/// claim, as any claim whose owner is gone, and is counted in
/// `norepeat_claims_not_taken_back_total`.
const MAX_PENDING_TAKE_BACKS: usize = 10_000;

/// The take-backs waiting now (see [`MAX_PENDING_TAKE_BACKS`]).
static PENDING_TAKE_BACKS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One of [`PENDING_TAKE_BACKS`], given back when its task ends (or is
/// dropped with its runtime).
struct PendingTakeBack;

impl PendingTakeBack {
    fn enter() -> Option<Self> {
        use std::sync::atomic::Ordering::Relaxed;
        let taken = PENDING_TAKE_BACKS.fetch_update(Relaxed, Relaxed, |n| {
            (n < MAX_PENDING_TAKE_BACKS).then_some(n + 1)
        });
        taken.is_ok().then(|| Self)
    }
}

impl Drop for PendingTakeBack {
    fn drop(&mut self) {
        PENDING_TAKE_BACKS.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A claim's store failure, as [`on_store_error`](crate::degrade::on_store_error)
/// answers any: `Ok` admits the request (fail-open), `Err` refuses it.
/// The claim tried was `ours` on `key` (over `previous`, for a take-over);
/// a refused request whose claim may have landed takes it back
/// ([`take_back`]). The one place every guard's claim failure goes
/// through.
pub(crate) fn on_claim_error<S: KeyValueStore + Clone>(
    mode: &'static str,
    policy: crate::degrade::FailurePolicy,
    error: StoreError,
    store: &S,
    key: Arc<str>,
    ours: Bytes,
    previous: Option<(Bytes, Duration)>,
) -> Result<(), StoreError> {
    let landed = error.may_have_landed();
    crate::degrade::on_store_error(mode, policy, error).inspect_err(|_| {
        if landed {
            take_back(store, key, ours, previous);
        }
    })
}

/// Takes back a claim whose request was refused for a store failure that
/// may have landed all the same ([`StoreError::may_have_landed`]: an
/// answer that never came, or a write the replicas did not acknowledge).
/// The request ran nothing, so its claim must not stay: its retry would
/// meet it and be refused (409 while its lease lasts, then an unknown
/// outcome) as if the request had run.
///
/// Owner-checked: only `ours`, these very bytes, is deleted, or, for a
/// claim that took over `previous` (a released or abandoned record),
/// replaced by `previous` again (for `ttl`); so it is safe however late
/// (a retry's own claim has other bytes). Tried in a task of its own,
/// now and then again with backoff for about half a minute
/// ([`TAKE_BACK_PAUSES`]): the store has just failed, and a failover
/// (Sentinel's, a cluster's) takes seconds, after which the promoted
/// replica may hold the claim. A key that does not hold `ours` yet is no
/// answer for the first second (the late write may still land, through a
/// reconnect or another pooled connection); after it, the store's first
/// answer ends the tries, so a store back from an outage gets at most a
/// few calls per refused request. A claim still there after every try
/// stays, as any claim whose owner is gone; so does one past
/// [`MAX_PENDING_TAKE_BACKS`].
fn take_back<S: KeyValueStore + Clone>(
    store: &S,
    key: Arc<str>,
    ours: Bytes,
    previous: Option<(Bytes, Duration)>,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let Some(pending) = PendingTakeBack::enter() else {
        metrics::counter!("norepeat_claims_not_taken_back_total").increment(1);
        return;
    };
    let store = store.clone();
    runtime.spawn(async move {
        let _pending = pending;
        let failed = Instant::now();
        for pause in TAKE_BACK_PAUSES {
            tokio::time::sleep(pause).await;
            let undone = match &previous {
                None => store.delete_if_equals(&key, &ours).await,
                Some((previous, ttl)) => store.replace_if_equals(&key, &ours, previous, *ttl).await,
            };
            match undone {
                Ok(true) => {
                    metrics::counter!("norepeat_claims_taken_back_total").increment(1);
                    return;
                }
                // Put back on the master, though its replicas did not
                // acknowledge it in time: the key no longer holds ours.
                Err(StoreError::NotReplicated(_)) => return,
                Ok(false) if failed.elapsed() >= Duration::from_secs(1) => return,
                _ => {}
            }
        }
    });
}

impl<S: KeyValueStore + Clone> Drop for Claim<S> {
    fn drop(&mut self) {
        if self.settled || !std::thread::panicking() {
            // Dropped mid-work (the caller gave up): the work may have had
            // its effect, so the key is kept until its TTL ends.
            return;
        }
        // The work panicked: it stopped and failed, release at once.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let store = self.store.clone();
            let key = std::mem::take(&mut self.key);
            let fence = Arc::clone(&self.fence);
            rt.spawn(async move {
                let _ = delete_owned(&store, &key, &fence).await;
            });
        }
    }
}

/// Runs `work` in a task of its own, so it goes on to its end (and stores
/// its result) even when the caller's future is dropped. A panic in the
/// task is resumed in the caller. Without a Tokio runtime the work runs
/// inline.
///
/// The task is spawned by this call, not at the first poll: the caller's
/// future then holds a join handle rather than `work` itself, which for a
/// handler under a claim is kilobytes in every request in flight.
pub(crate) fn detach<F>(work: F) -> impl Future<Output = F::Output> + Send
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let spawned = match tokio::runtime::Handle::try_current() {
        Ok(rt) => Ok(rt.spawn(work)),
        Err(_) => Err(Box::pin(work)),
    };
    joined(spawned)
}

/// Runs `work` in the caller's own future, and moves it into a task of its
/// own only if that future is dropped before `work` ends: the work then goes
/// on to its end (and stores its result) all the same. Tracked by `tracker`
/// either way, so a server can close the tracker and wait for the work to
/// end before it exits.
///
/// Against [`detach`], a request whose caller waits (nearly all) costs no
/// task: no spawn, no join handle, no wake-up across threads. The caller's
/// future holds a pointer to the boxed work, not a handler's future, and
/// the box moves into the task unchanged (a pinned box may move). A panic
/// in the work unwinds through the caller, as a resumed panic from a task
/// did; the panicked work is never spawned.
///
/// The work comes boxed: built as `Box::pin(async move { .. })` at the
/// call, the handler's future (kilobytes) is written once, into its box,
/// instead of being copied on its way through this function.
pub(crate) fn detach_tracked<F>(
    tracker: &tokio_util::task::TaskTracker,
    work: std::pin::Pin<Box<F>>,
) -> DetachOnDrop<tokio_util::task::task_tracker::TrackedFuture<std::pin::Pin<Box<F>>>>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    DetachOnDrop {
        work: Some(tracker.track_future(work)),
        runtime: tokio::runtime::Handle::try_current().ok(),
        polling: false,
    }
}

/// Runs `work` in the caller's own future, and moves it into a task of its
/// own if that future is dropped before `work` ends, as [`detach_tracked`]
/// does, untracked: for short work that must not stop half-way (storing a
/// result once the body is done).
pub(crate) fn carry_on<F>(work: std::pin::Pin<Box<F>>) -> DetachOnDrop<std::pin::Pin<Box<F>>>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    DetachOnDrop {
        work: Some(work),
        runtime: tokio::runtime::Handle::try_current().ok(),
        polling: false,
    }
}

/// Work run in its caller's future until that future is dropped, then in a
/// task of its own (see [`detach_tracked`]).
pub(crate) struct DetachOnDrop<F: Future + Unpin + Send + 'static>
where
    F::Output: Send + 'static,
{
    /// `None` once the work has ended.
    work: Option<F>,
    /// Where a dropped caller's work goes on: the runtime the work was
    /// made on, whatever thread drops the caller's future.
    runtime: Option<tokio::runtime::Handle>,
    /// Set while the work is polled: still set when it is dropped, the
    /// work panicked, and is not carried on.
    polling: bool,
}

impl<F> Future for DetachOnDrop<F>
where
    F: Future + Unpin + Send + 'static,
    F::Output: Send + 'static,
{
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        // `Self` is `Unpin` (the work is boxed).
        let this = &mut *self;
        let Some(work) = this.work.as_mut() else {
            panic!("DetachOnDrop polled after it answered");
        };
        this.polling = true;
        let out = std::pin::Pin::new(work).poll(cx);
        this.polling = false;
        if out.is_ready() {
            this.work = None;
        }
        out
    }
}

impl<F> Drop for DetachOnDrop<F>
where
    F: Future + Unpin + Send + 'static,
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        let Some(work) = self.work.take() else {
            return;
        };
        if self.polling {
            // The work panicked: it is over, like a panicked task.
            return;
        }
        let runtime = self
            .runtime
            .take()
            .or_else(|| tokio::runtime::Handle::try_current().ok());
        match runtime {
            Some(rt) => drop(rt.spawn(work)),
            // No runtime to carry it on: dropped, as a task is when its
            // runtime shuts down (the claim then ends with its TTL).
            None => drop(work),
        }
    }
}

/// The output of detached work: awaited from its task, or run inline.
async fn joined<F, T>(spawned: Result<tokio::task::JoinHandle<T>, std::pin::Pin<Box<F>>>) -> T
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    match spawned {
        Err(inline) => inline.await,
        Ok(task) => match task.await {
            Ok(out) => out,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Only at runtime shutdown: nothing is left to answer to.
            Err(e) => panic!("detached work cancelled: {e}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    /// `detach` spawns when called: the work starts without the returned
    /// future being polled, and that future holds a join handle, not the
    /// work (before, it held the work until its first poll, which put a
    /// whole handler's future into every idempotency request's).
    #[tokio::test]
    async fn detach_spawns_at_once_and_does_not_carry_the_work() {
        let (started, is_started) = tokio::sync::oneshot::channel();
        let work = async move {
            let buf = [7u8; 4096];
            let _ = started.send(());
            tokio::task::yield_now().await;
            buf.iter().map(|&b| u64::from(b)).sum::<u64>()
        };
        assert!(std::mem::size_of_val(&work) >= 4096);
        let detached = detach(work);
        assert!(
            std::mem::size_of_val(&detached) < 256,
            "the detached future is {} bytes",
            std::mem::size_of_val(&detached)
        );
        tokio::time::timeout(Duration::from_secs(5), is_started)
            .await
            .expect("the work runs before its future is polled")
            .expect("the work sends");
        assert_eq!(detached.await, 7 * 4096);
    }

    /// `detach_tracked` runs the work in the caller's future (nothing
    /// starts before it is polled, and no task is spawned while the caller
    /// waits), tracked all the while; dropped half-way, the work moves into
    /// a task and runs to its end, still tracked.
    #[tokio::test]
    async fn detach_tracked_runs_inline_and_carries_on_when_dropped() {
        let tracker = tokio_util::task::TaskTracker::new();
        let metrics = tokio::runtime::Handle::current().metrics();
        let (started, is_started) = tokio::sync::oneshot::channel::<()>();
        let (go, gate) = tokio::sync::oneshot::channel::<()>();
        let (ended, has_ended) = tokio::sync::oneshot::channel::<u32>();
        let alive_before = metrics.num_alive_tasks();
        let mut work = detach_tracked(
            &tracker,
            Box::pin(async move {
                let _ = started.send(());
                let _ = gate.await;
                let _ = ended.send(7);
                7u32
            }),
        );
        assert_eq!(tracker.len(), 1, "tracked before it runs");
        tokio::task::yield_now().await;
        let mut is_started = is_started;
        assert!(
            is_started.try_recv().is_err(),
            "the work started without being polled: it was spawned"
        );
        // Polled once: started, waiting at the gate.
        assert!(futures_util::poll!(&mut work).is_pending());
        assert!(is_started.try_recv().is_ok());
        assert_eq!(
            metrics.num_alive_tasks(),
            alive_before,
            "no task while the caller waits"
        );
        // The caller gives up: the work goes on in a task of its own.
        drop(work);
        assert_eq!(metrics.num_alive_tasks(), alive_before + 1);
        assert_eq!(tracker.len(), 1, "still tracked in its task");
        go.send(()).unwrap();
        let out = tokio::time::timeout(Duration::from_secs(5), has_ended)
            .await
            .expect("the dropped work ran to its end")
            .expect("the work sends");
        assert_eq!(out, 7);
        tracker.close();
        tokio::time::timeout(Duration::from_secs(5), tracker.wait())
            .await
            .expect("the tracker empties once the work ends");

        // A caller that waits gets the output, and no task was spawned.
        let tracker = tokio_util::task::TaskTracker::new();
        let alive = metrics.num_alive_tasks();
        let waited = detach_tracked(
            &tracker,
            Box::pin(async move {
                tokio::task::yield_now().await;
                metrics.num_alive_tasks()
            }),
        );
        assert_eq!(waited.await, alive, "no task while the caller waits");
        assert!(tracker.is_empty());
    }

    /// A panic in detached work unwinds through its caller, and the
    /// panicked work is not carried on in a task when the caller's future
    /// is then dropped.
    #[tokio::test]
    async fn detach_tracked_panics_through_the_caller_and_is_not_respawned() {
        let tracker = tokio_util::task::TaskTracker::new();
        let metrics = tokio::runtime::Handle::current().metrics();
        let before = metrics.num_alive_tasks();
        let mut work = detach_tracked(
            &tracker,
            Box::pin(async {
                tokio::task::yield_now().await;
                panic!("injected");
            }),
        );
        assert!(futures_util::poll!(&mut work).is_pending());
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let waker = futures_util::task::noop_waker();
            let mut cx = std::task::Context::from_waker(&waker);
            let _ = std::pin::Pin::new(&mut work).poll(&mut cx);
        }));
        assert!(unwound.is_err(), "the panic reaches the caller");
        drop(work);
        assert_eq!(
            metrics.num_alive_tasks(),
            before,
            "a panicked work was spawned"
        );
        assert!(tracker.is_empty());
    }

    /// A claim of `key` on `store`, which must be free.
    /// Take-backs are bounded: past [`MAX_PENDING_TAKE_BACKS`] waiting at
    /// once, one more leaves its claim instead of adding a task; as they
    /// end, room comes back. (Keys that are not there: each try answers
    /// "not ours", and the task waits out its first second.) Before: one
    /// task per refusal, without bound, each for up to 31 s.
    #[tokio::test]
    async fn take_backs_waiting_at_once_are_bounded() {
        use std::sync::atomic::Ordering::Relaxed;
        let store = MemoryStore::default();
        for i in 0..MAX_PENDING_TAKE_BACKS + 100 {
            take_back(
                &store,
                Arc::from(format!("k{i}")),
                Bytes::from_static(b"v"),
                None,
            );
        }
        assert_eq!(PENDING_TAKE_BACKS.load(Relaxed), MAX_PENDING_TAKE_BACKS);
        let mut waited = Duration::ZERO;
        while PENDING_TAKE_BACKS.load(Relaxed) > 0 && waited < Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            waited += Duration::from_millis(100);
        }
        assert_eq!(PENDING_TAKE_BACKS.load(Relaxed), 0);
        take_back(&store, Arc::from("again"), Bytes::from_static(b"v"), None);
        assert_eq!(PENDING_TAKE_BACKS.load(Relaxed), 1);
    }

    async fn owned(store: &MemoryStore, key: &str, ttl: Duration) -> Claim<MemoryStore> {
        match Claim::acquire(store, key, b"a".to_vec(), ttl).await {
            Ok(Claimed::Owned(claim)) => claim,
            _ => panic!("{key} is not free"),
        }
    }

    /// Work that ends at its first poll is not registered with the
    /// renewer; work that waits is, and is renewed while it waits.
    #[tokio::test]
    async fn only_work_that_waits_is_registered_for_renewal() {
        let store = MemoryStore::default();
        let renewer = Renewer::new(store.clone());
        let ttl = Duration::from_millis(300);
        let claim = owned(&store, "k", ttl).await;
        let renewal = Renewal::thirds(ttl);
        assert_eq!(
            claim.run_renewed_by(&renewer, async { 1 }, renewal).await,
            1
        );
        assert_eq!(renewer.registered(), 0, "work done at once was registered");

        // Work that outlives the TTL keeps its key through the renewer.
        let slow = async {
            tokio::time::sleep(ttl * 2).await;
            2
        };
        assert_eq!(claim.run_renewed_by(&renewer, slow, renewal).await, 2);
        assert_eq!(renewer.registered(), 1);
        assert!(
            store.put_if_absent("k", b"b", ttl).await.unwrap().is_some(),
            "the waiting work's key was not renewed"
        );
        claim.keep();
    }

    /// Registering does not poll the work again: one poll when it starts
    /// waiting, one when it is woken.
    #[tokio::test]
    async fn registering_for_renewal_polls_the_work_once_per_wake() {
        let store = MemoryStore::default();
        let renewer = Renewer::new(store.clone());
        let ttl = Duration::from_secs(30);
        let claim = owned(&store, "k", ttl).await;
        let (tx, mut rx) = tokio::sync::oneshot::channel::<u8>();
        let polls = std::sync::atomic::AtomicU32::new(0);
        let work = std::future::poll_fn(|cx| {
            polls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            std::pin::Pin::new(&mut rx).poll(cx).map(Result::unwrap)
        });
        let run = claim.run_renewed_by(&renewer, work, Renewal::thirds(ttl));
        let sender = async {
            tokio::task::yield_now().await;
            tx.send(5).unwrap();
        };
        let (out, ()) = tokio::join!(run, sender);
        assert_eq!(out, 5);
        assert_eq!(renewer.registered(), 1);
        assert_eq!(polls.load(std::sync::atomic::Ordering::Relaxed), 2);
        claim.keep();
    }

    /// A lease of `Duration::MAX` runs its work, by itself and through the
    /// shared renewer, without an `Instant` overflow (before: a panic when
    /// the first renewal was scheduled).
    #[tokio::test]
    async fn the_longest_lease_runs_its_work() {
        let store = MemoryStore::default();
        let claim = owned(&store, "k", Duration::MAX).await;
        let renewal = Renewal {
            every: Duration::MAX / 3,
            max: Duration::MAX,
        };
        assert_eq!(claim.run(async { 7 }, renewal).await, 7);
        let renewer = Renewer::new(store.clone());
        let registered = renewer.register(
            Arc::from("k"),
            Fence::fixed(Bytes::from_static(b"a"), Duration::from_secs(1)),
            (Duration::from_secs(1), Duration::from_secs(1)),
            Duration::MAX,
            Duration::MAX,
        );
        assert!(registered.is_some());
        tokio::task::yield_now().await;
        claim.keep();
    }

    #[tokio::test]
    async fn a_dropped_run_keeps_the_key_and_a_panic_releases_it() {
        let store = MemoryStore::default();
        let ttl = Duration::from_secs(5);
        let claim = owned(&store, "k", ttl).await;
        let run = claim.run(std::future::pending::<()>(), Renewal::thirds(ttl));
        let _ = tokio::time::timeout(Duration::from_millis(5), run).await;
        drop(claim);
        assert!(store.put_if_absent("k", b"b", ttl).await.unwrap().is_some());

        let claim = owned(&store, "p", ttl).await;
        let panicked = tokio::spawn(async move {
            let _claim = claim;
            panic!("injected");
        })
        .await;
        assert!(panicked.is_err());
        for _ in 0..50 {
            if store.put_if_absent("p", b"b", ttl).await.unwrap().is_none() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("a panicked claim was not released");
    }
}
