// Over 400 lines on purpose: 260 lines are the tests of one renewal task, whose timing they pin down.
//! One task that renews every running claim of a guard when it is due.
//!
//! A claim whose work runs longer than a third of its TTL is extended
//! (owner-checked `expire_if_equals`) so that it does not expire under the
//! work. Arming a timer per request for this costs every request a timer
//! registration and a `select!`, although almost none runs long enough to
//! need a renewal. Here a request only inserts its claim into a shared
//! table on the way in and removes it on the way out (one short lock each);
//! one task per guard sleeps until the earliest renewal is due and sends
//! every renewal due then at once, concurrently (on one multiplexed Redis
//! connection they share the socket rather than each waiting for the
//! previous reply). Each renewal has a time budget of its claim's renewal
//! interval: one that hangs is abandoned (and tried again when next due),
//! so it never holds up the renewals of the other claims.
//!
//! Renewal still stops with the request: the table entry is removed when
//! the request's future ends or is dropped, so an abandoned claim keeps
//! its key no longer than its TTL.

use super::{FOREVER, Fence};
use crate::store::KeyValueStore;
use futures_util::future::join_all;
use slab::Slab;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// A claim the task renews.
struct Entry {
    key: Arc<str>,
    fence: Arc<Fence>,
    ttl: Duration,
    every: Duration,
    /// When the next renewal is due.
    due: Instant,
    /// The last moment a renewal may start (its new TTL must not pass the
    /// claim's total hold).
    last: Instant,
    /// Renewal is over: the claim was lost (a renewal answered "not
    /// yours") or its total hold is reached.
    stopped: bool,
    /// Distinguishes this entry from a later one in the same slot.
    generation: u64,
}

struct Shared<S> {
    store: S,
    entries: Mutex<Table>,
    wake: Notify,
    /// How often the task woke (for the tests).
    #[cfg(test)]
    wakes: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct Table {
    slab: Slab<Entry>,
    generation: u64,
    /// When the task means to wake next (`None`: when told).
    target: Option<Instant>,
    /// The task renewing this table, once started.
    task: Option<tokio::task::JoinHandle<()>>,
}

/// The renewals of one guard's claims. Cheap to clone (clones share the
/// table and the task). The task starts with the first claim that needs it
/// and ends (within a few seconds) once every clone and registration is
/// dropped.
pub(crate) struct Renewer<S> {
    shared: Arc<Shared<S>>,
}

impl<S> Clone for Renewer<S> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S> std::fmt::Debug for Renewer<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renewer").finish_non_exhaustive()
    }
}

/// A claim's place in the table; dropping it stops the claim's renewal.
pub(crate) struct Registration<S: KeyValueStore + Clone> {
    shared: Arc<Shared<S>>,
    slot: usize,
    generation: u64,
}

impl<S> Renewer<S> {
    /// An empty table over `store`. No task runs yet.
    pub(crate) fn new(store: S) -> Self {
        Self {
            shared: Arc::new(Shared {
                store,
                entries: Mutex::new(Table::default()),
                wake: Notify::new(),
                #[cfg(test)]
                wakes: std::sync::atomic::AtomicU64::new(0),
            }),
        }
    }
}

#[cfg(test)]
impl<S> Renewer<S> {
    /// How many claims were ever registered (for the tests).
    pub(crate) fn registered(&self) -> u64 {
        lock(&self.shared.entries).generation
    }
}

impl<S: KeyValueStore + Clone> Renewer<S> {
    /// Renews `key` (while it holds `fence`'s value) to a full `ttl` and
    /// `lease` every `every` until `max` has passed since now, for as long
    /// as the returned registration lives. `None` when there is no Tokio
    /// runtime to run the task on (the caller then renews by itself).
    pub(crate) fn register(
        &self,
        key: Arc<str>,
        fence: Arc<Fence>,
        (ttl, lease): (Duration, Duration),
        every: Duration,
        max: Duration,
    ) -> Option<Registration<S>> {
        let now = Instant::now();
        let every = every.clamp(Duration::from_millis(1), FOREVER);
        let due = now + every;
        let last = now + max.saturating_sub(lease).min(FOREVER);
        let mut table = lock(&self.shared.entries);
        // A task ends with its runtime: start one on this runtime then.
        if table
            .task
            .as_ref()
            .is_none_or(tokio::task::JoinHandle::is_finished)
        {
            let handle = tokio::runtime::Handle::try_current().ok()?;
            table.task = Some(handle.spawn(drive(Arc::downgrade(&self.shared))));
        }
        table.generation += 1;
        let generation = table.generation;
        let slot = table.slab.insert(Entry {
            key,
            fence,
            ttl,
            every,
            due,
            last,
            stopped: false,
            generation,
        });
        let sooner = table.target.is_none_or(|t| due < t);
        drop(table);
        if sooner {
            self.shared.wake.notify_one();
        }
        Some(Registration {
            shared: Arc::clone(&self.shared),
            slot,
            generation,
        })
    }
}

impl<S: KeyValueStore + Clone> Drop for Registration<S> {
    fn drop(&mut self) {
        let mut table = lock(&self.shared.entries);
        if table
            .slab
            .get(self.slot)
            .is_some_and(|e| e.generation == self.generation)
        {
            table.slab.remove(self.slot);
        }
    }
}

fn lock(m: &Mutex<Table>) -> std::sync::MutexGuard<'_, Table> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The task: sleep until the earliest renewal is due (or a sooner claim
/// arrives), renew everything due, again. Ends when the renewer is gone.
async fn drive<S: KeyValueStore + Clone>(shared: Weak<Shared<S>>) {
    loop {
        let Some(strong) = shared.upgrade() else {
            return;
        };
        let target = {
            let mut table = lock(&strong.entries);
            let next = table
                .slab
                .iter()
                .filter(|(_, e)| !e.stopped && e.due <= e.last)
                .map(|(_, e)| e.due)
                .min();
            table.target = next;
            next
        };
        // Every renewer and registration gone: only this task holds the
        // table, and it ends at its next idle look.
        let wake = async {
            match target {
                Some(t) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(t) => {}
                        () = strong.wake.notified() => {}
                    }
                }
                None => strong.wake.notified().await,
            }
        };
        let gone = tokio::select! {
            () = wake => false,
            // Wake now and then to notice a renewer that was dropped.
            () = tokio::time::sleep(Duration::from_secs(5)), if target.is_none() => true,
        };
        if gone && Arc::strong_count(&strong) == 1 {
            return;
        }
        #[cfg(test)]
        strong
            .wakes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        renew_due(&strong).await;
    }
}

/// Renews every entry that is due, all at once.
async fn renew_due<S: KeyValueStore + Clone>(shared: &Shared<S>) {
    let now = Instant::now();
    // Slot, generation, key, fence, ttl, interval.
    type Due = (usize, u64, Arc<str>, Arc<Fence>, Duration, Duration);
    let due: Vec<Due> = {
        let mut table = lock(&shared.entries);
        table
            .slab
            .iter_mut()
            .filter(|(_, e)| !e.stopped && e.due <= now)
            .filter_map(|(slot, e)| {
                if now > e.last {
                    // Woken after the last moment a renewal may start (a
                    // busy runtime): stop, or this entry would stay due
                    // and wake the task again at once, forever.
                    e.stopped = true;
                    return None;
                }
                e.due = now + e.every;
                Some((
                    slot,
                    e.generation,
                    Arc::clone(&e.key),
                    Arc::clone(&e.fence),
                    e.ttl,
                    e.every,
                ))
            })
            .collect()
    };
    if due.is_empty() {
        return;
    }
    // Each renewal has a budget of its interval: one that hangs (a SQL pool
    // whose only connection is busy) is abandoned, and the others, and the
    // next renewals of every claim, do not wait for it.
    // A claim being completed or released (its fence taken) is skipped.
    let results = join_all(due.iter().map(|(_, _, key, fence, ttl, every)| {
        tokio::time::timeout(
            (*every).max(Duration::from_millis(1)),
            fence.renew(&shared.store, key, *ttl, false),
        )
    }))
    .await;
    let mut table = lock(&shared.entries);
    for ((slot, generation, key, _, _, _), result) in due.iter().zip(results) {
        let Ok(result) = result else {
            tracing::debug!(
                key = &**key,
                "claim renewal ran out of its time budget; will retry"
            );
            continue;
        };
        match result {
            Ok(true) => {
                metrics::counter!("norepeat_lease_renewals_total", "renewed" => "yes").increment(1);
            }
            Ok(false) => {
                metrics::counter!("norepeat_lease_renewals_total", "renewed" => "lost")
                    .increment(1);
                tracing::warn!(key = &**key, "claim lost while its work runs");
                if let Some(e) = table.slab.get_mut(*slot)
                    && e.generation == *generation
                {
                    e.stopped = true;
                }
            }
            Err(e) => tracing::debug!(error = %e, "claim renewal failed; will retry"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::{Claim, Claimed, Renewal};
    use crate::store::KeyValueStoreExt;
    use crate::store::{KeyOp, KeyReply, MemoryStore, StoreError};
    use bytes::Bytes;
    use std::sync::atomic::{AtomicU64, Ordering};

    // No test here rests on a fixed margin a busy machine can break: what
    // must happen is polled for up to `DEADLINE`, and what must not happen
    // (a held key expiring) has most of a TTL of slack: renewals come every
    // 100 ms, a key renewed lives 2 s, so a renewal task starved for less
    // than 1.9 s still keeps it. (Tokio's paused clock would not do: the
    // memory store times its keys with `std::time::Instant`.)

    /// A claim's time to live.
    const TTL: Duration = Duration::from_secs(2);
    /// How often the tests' claims are renewed: a twentieth of [`TTL`].
    const EVERY: Duration = Duration::from_millis(100);
    /// How long a test waits for what must happen.
    const DEADLINE: Duration = Duration::from_secs(20);

    /// A memory store that counts the renewals (`expire_if_equals`) it is
    /// sent.
    #[derive(Clone, Default)]
    struct Counted {
        inner: MemoryStore,
        renewals: Arc<AtomicU64>,
    }

    impl Counted {
        fn renewals(&self) -> u64 {
            self.renewals.load(Ordering::Relaxed)
        }
    }

    impl KeyValueStore for Counted {
        async fn execute(&self, op: KeyOp<'_>) -> Result<KeyReply, StoreError> {
            if matches!(op, KeyOp::ExpireIfEquals { .. }) {
                self.renewals.fetch_add(1, Ordering::Relaxed);
            }
            self.inner.execute(op).await
        }
        fn kind(&self) -> &'static str {
            "counted"
        }
    }

    /// Registers `k` held by `me`, renewed to a full [`TTL`] every
    /// [`EVERY`] up to a total hold of `max`.
    fn register<S: KeyValueStore + Clone>(renewer: &Renewer<S>, max: Duration) -> Registration<S> {
        renewer
            .register(Arc::from("k"), me(), (TTL, TTL), EVERY, max)
            .expect("a runtime is here")
    }

    /// The fence of a claim held by the value `me`, renewed by its TTL.
    fn me() -> Arc<Fence> {
        Fence::fixed(Bytes::from_static(b"me"), TTL)
    }

    /// Whether `k` is free: a new claim on it succeeds.
    async fn free(store: &MemoryStore) -> bool {
        store
            .put_if_absent("k", b"new", TTL)
            .await
            .unwrap()
            .is_none()
    }

    /// Who holds `k` (leaving it as it is).
    async fn holder(store: &MemoryStore) -> Option<Bytes> {
        store.put_if_absent("k", b"other", TTL).await.unwrap()
    }

    /// Polls `done` every 10 ms until it is true; panics, saying `what`,
    /// after [`DEADLINE`].
    async fn until<F: Future<Output = bool>>(what: &str, mut done: impl FnMut() -> F) {
        let deadline = Instant::now() + DEADLINE;
        while !done().await {
            assert!(Instant::now() < deadline, "not within {DEADLINE:?}: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A claim registered past its TTL keeps its key while registered, and
    /// loses it once the registration is dropped.
    #[tokio::test]
    async fn renews_while_registered_and_stops_when_dropped() {
        let store = MemoryStore::default();
        assert!(free_for(&store, b"me").await);
        let renewer = Renewer::new(store.clone());
        let reg = register(&renewer, Duration::MAX);
        tokio::time::sleep(TTL + TTL / 4).await;
        assert_eq!(
            holder(&store).await.as_deref(),
            Some(&b"me"[..]),
            "renewed past its first TTL"
        );
        drop(reg);
        until("expired once no longer registered", || free(&store)).await;
    }

    /// A claim taken over by someone else is not renewed for them.
    #[tokio::test]
    async fn a_lost_claim_is_not_renewed() {
        let store = Counted::default();
        assert!(free_for(&store.inner, b"other").await);
        let renewer = Renewer::new(store.clone());
        let _reg = register(&renewer, Duration::MAX);
        until("a renewal was tried", || async { store.renewals() > 0 }).await;
        until("the other owner's key expired on its own", || {
            free(&store.inner)
        })
        .await;
    }

    /// A store that forgets (FLUSHALL, a restart without persistence):
    /// renewal is owner-checked, so it never writes the key back.
    #[tokio::test]
    async fn a_forgotten_key_is_not_written_back() {
        let store = Counted::default();
        assert!(free_for(&store.inner, b"me").await);
        let renewer = Renewer::new(store.clone());
        let _reg = register(&renewer, Duration::MAX);
        assert!(store.inner.delete_if_equals("k", b"me").await.unwrap());
        let before = store.renewals();
        until(
            "a renewal was tried after the key was forgotten",
            || async { store.renewals() > before },
        )
        .await;
        assert!(free(&store.inner).await, "renewal did not recreate the key");
    }

    /// Renewal stops at the total hold: the key, renewed for a while, is
    /// then let go.
    #[tokio::test]
    async fn stops_at_the_total_hold() {
        let store = MemoryStore::default();
        assert!(free_for(&store, b"me").await);
        let renewer = Renewer::new(store.clone());
        let _reg = register(&renewer, TTL + EVERY * 3);
        until("let go after its total hold", || free(&store)).await;
    }

    /// A caller that gives up half-way through `Claim::run_renewed_by`: its
    /// work is dropped, and with it the registration, so the key is renewed
    /// no more and ends with its TTL.
    #[tokio::test]
    async fn a_caller_that_gives_up_stops_the_renewal() {
        let store = MemoryStore::default();
        let Ok(Claimed::Owned(claim)) = Claim::acquire(&store, "k", b"me".to_vec(), TTL).await
        else {
            panic!("first claim");
        };
        let renewer = Renewer::new(store.clone());
        let renewal = Renewal {
            every: EVERY,
            max: Duration::MAX,
        };
        let work = claim.run_renewed_by(&renewer, std::future::pending::<()>(), renewal);
        // Runs (and is renewed) past its first TTL, then the caller gives up.
        let gave_up = tokio::time::timeout(TTL + TTL / 4, work).await;
        assert!(gave_up.is_err());
        assert!(!free(&store).await, "renewed while the work ran");
        until("not renewed after the caller gave up", || free(&store)).await;
        claim.keep();
    }

    /// A task woken after the last moment a renewal may start (the
    /// runtime was busy) stops renewing that claim: it sends no renewal
    /// (one started then would hold the key past its total hold), and it
    /// does not spin on an entry that stays due.
    ///
    /// Without the branch of `renew_due` that stops such an entry, the late
    /// wake sends one renewal (`renewals` is 1); with the branch but not
    /// its `stopped = true`, the entry stays due and the task wakes again
    /// at once, forever (`wakes` in the thousands).
    #[tokio::test(flavor = "current_thread")]
    async fn a_late_wake_past_the_total_hold_does_not_spin() {
        let store = Counted::default();
        assert!(free_for(&store.inner, b"me").await);
        let renewer = Renewer::new(store.clone());
        // Due after 20 ms, last renewal may start at 40 ms.
        let _reg = renewer
            .register(
                Arc::from("k"),
                me(),
                (TTL, TTL),
                Duration::from_millis(20),
                TTL + Duration::from_millis(40),
            )
            .expect("a runtime is here");
        // The only thread is busy past both (a busier machine only makes
        // the wake later), so the task first runs too late to renew.
        std::thread::sleep(Duration::from_millis(60));
        // Let the task run: it wakes at once (the renewal is overdue); a
        // task that spins has a whole second to show it.
        until("the task woke", || async {
            renewer.shared.wakes.load(Ordering::Relaxed) > 0
        })
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            store.renewals(),
            0,
            "a renewal started past the last moment"
        );
        let wakes = renewer.shared.wakes.load(Ordering::Relaxed);
        assert!(wakes < 10, "the task woke {wakes} times");
    }

    /// A store whose calls on `slow` never answer (a SQL pool whose only
    /// connection is held elsewhere); every other key is a memory store's.
    #[derive(Clone, Default)]
    struct OneKeyHangs(MemoryStore);

    impl KeyValueStore for OneKeyHangs {
        async fn execute(&self, op: KeyOp<'_>) -> Result<KeyReply, StoreError> {
            if op.key() == "slow" {
                std::future::pending::<()>().await;
            }
            self.0.execute(op).await
        }
        fn kind(&self) -> &'static str {
            "one-key-hangs"
        }
    }

    /// One claim whose renewals never answer does not hold up another's:
    /// each renewal has its interval as its budget. Before, the batch of
    /// due renewals was awaited whole, so `k` was never renewed again and
    /// expired under its work.
    #[tokio::test]
    async fn a_renewal_that_hangs_does_not_hold_up_the_others() {
        let store = OneKeyHangs::default();
        assert!(free_for(&store.0, b"me").await);
        let renewer = Renewer::new(store.clone());
        let _slow = renewer
            .register(Arc::from("slow"), me(), (TTL, TTL), EVERY, Duration::MAX)
            .expect("a runtime is here");
        let _reg = register(&renewer, Duration::MAX);
        tokio::time::sleep(TTL + TTL / 4).await;
        assert_eq!(
            holder(&store.0).await.as_deref(),
            Some(&b"me"[..]),
            "k was renewed past its first TTL"
        );
    }

    /// Puts `k` for [`TTL`] with `value`; whether it was free.
    async fn free_for(store: &MemoryStore, value: &[u8]) -> bool {
        store
            .put_if_absent("k", value, TTL)
            .await
            .unwrap()
            .is_none()
    }
}
