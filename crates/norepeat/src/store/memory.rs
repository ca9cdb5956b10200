// Over 400 lines on purpose: one store and its tests; 100 lines are tests.
//! The in-process store: bounded in bytes, every entry expiring.

use super::rate::arithmetic::{self, FixedState, SlidingState};
use super::{KeyOp, KeyReply, KeyValueStore, RateDecision, RateOp, RateStore, StoreError};
use bytes::Bytes;
use hashlink::LinkedHashMap;
use hashlink::linked_hash_map::RawEntryMut;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// What one key holds in memory.
#[derive(Clone, Debug)]
enum Value {
    Bytes(Bytes),
    Gcra(u64),
    Fixed(FixedState),
    Sliding(SlidingState),
}

#[derive(Clone, Debug)]
struct Entry {
    value: Value,
    expires_at: Instant,
}

/// What an operation does to its key.
enum Op {
    Nop,
    Put(Entry),
    Remove,
}

/// Bytes an entry costs beyond its key and value: the entry itself, the
/// key's allocation, the map's slot and its two links, rounded up.
const ENTRY_OVERHEAD: usize = 128;

/// An entry's weight: its key, its value and [`ENTRY_OVERHEAD`], in bytes.
fn weigh(key: &str, e: &Entry) -> u64 {
    let value = match &e.value {
        Value::Bytes(b) => b.len(),
        Value::Gcra(_) | Value::Fixed(_) | Value::Sliding(_) => 0,
    };
    (key.len() + value + ENTRY_OVERHEAD) as u64
}

/// The shards a store's keys are spread over: each has its own lock, so
/// calls on different keys rarely wait for one another.
const SHARDS: usize = 32;

/// One shard's keys, the least recently used first.
#[derive(Default)]
struct Shard {
    map: LinkedHashMap<Arc<str>, Entry, RandomState>,
    /// Writes since the expired entries were last swept out.
    writes: usize,
    /// No entry in the shard expires before this: until then a sweep
    /// would find nothing.
    soonest: Option<Instant>,
}

impl Shard {
    /// Removes the expired entries, when some may be and at least
    /// `min_writes` writes came since the last sweep (a sweep reads the
    /// whole shard: run once per so many writes, its cost per write stays
    /// a few entries' reading however large the shard).
    fn sweep(&mut self, now: Instant, used: &AtomicU64, min_writes: usize) {
        if self.soonest.is_none_or(|s| s > now) || self.writes < min_writes {
            return;
        }
        let mut freed = 0;
        let mut soonest: Option<Instant> = None;
        self.map.retain(|key, e| {
            if e.expires_at > now {
                soonest = Some(soonest.map_or(e.expires_at, |s| s.min(e.expires_at)));
                true
            } else {
                freed += weigh(key, e);
                false
            }
        });
        used.fetch_sub(freed, Ordering::Relaxed);
        self.soonest = soonest;
        self.writes = 0;
    }
}

/// A bounded in-memory [`Store`](super::Store): the embedded default, and the local
/// fallback that keeps catching one instance's own repeats while Redis is
/// away.
///
/// Each operation runs under its key's lock (one of 32 shards'), so it is
/// atomic against every other operation on the same key, and never waits
/// on anything but that lock, held for the operation alone: no call
/// sleeps or blocks the thread that makes it (an async runtime's worker
/// goes on with its other tasks). Entries expire at their own time
/// to live. A time to live past ten years (`Duration::MAX` as a
/// lease or a retention) is ten years; none overflows. It is shared by clones, not across processes.
///
/// ```
/// use norepeat::store::{KeyValueStoreExt, MemoryStore};
/// use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), norepeat::store::StoreError> {
/// let store = MemoryStore::new(16 << 20); // 16 MiB
/// assert!(store.put_if_absent("key", b"1", Duration::from_secs(1)).await?.is_none());
/// assert!(store.put_if_absent("key", b"2", Duration::from_secs(1)).await?.is_some());
/// assert_eq!(store.evictions(), 0);
/// # Ok(()) }
/// ```
///
/// # When it is full
/// Its capacity is in bytes: each entry is counted as its key, its value
/// (a stored response counts whole) and 128 bytes of bookkeeping (an
/// estimate, rounded up, not a measurement), so a fingerprint or
/// a token counts under 200 bytes and the default 64 MiB holds over
/// 330,000 of them (64 MiB / 200 B).
///
/// A new key is always taken. To make room, the entries used least
/// recently are evicted (LRU within each shard: the shard of the new key
/// first, then the others in turn). A frequency-based policy would keep a
/// popular old key and drop the newcomer, and the newcomer is exactly the
/// request whose duplicate the guard is there to catch.
///
/// An evicted key is forgotten before its time to live: the guard then
/// remembers less than it was asked to, never more. For the fingerprint
/// and token guards a repeat of an evicted key is admitted; for
/// idempotency a retry runs again instead of being replayed (the
/// database's unique keys still make the effect single); a rate limiter
/// starts the key's count afresh. Size the store so that this does not
/// happen in normal operation: every eviction of a live key is counted in
/// [`evictions`](Self::evictions) and in the metric
/// `norepeat_memory_evictions_total`, which should stay at zero.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    shards: Box<[Mutex<Shard>]>,
    /// Hashes a key once: its shard, and its place in the shard's map
    /// (every shard's map hashes with a clone of it).
    hasher: RandomState,
    capacity: u64,
    /// Bytes held over all shards, by [`weigh`].
    used: AtomicU64,
    evictions: AtomicU64,
    /// The next shard to evict from when a new key's own shard has
    /// nothing older to give.
    next_victim: AtomicUsize,
    origin: Instant,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("entries", &self.len())
            .field("bytes", &self.inner.used.load(Ordering::Relaxed))
            .field("evictions", &self.inner.evictions.load(Ordering::Relaxed))
            .finish()
    }
}

impl Default for MemoryStore {
    /// [`DEFAULT_CAPACITY`](Self::DEFAULT_CAPACITY): 64 MiB.
    fn default() -> Self {
        Self::new(Self::DEFAULT_CAPACITY)
    }
}

impl MemoryStore {
    /// The capacity of [`MemoryStore::default`]: 64 MiB.
    pub const DEFAULT_CAPACITY: u64 = 64 << 20;

    /// The smallest capacity: 64 KiB (a few hundred small entries). A
    /// smaller one is raised to it, so that an ordinary entry always fits.
    pub const MIN_CAPACITY: u64 = 64 << 10;

    /// A store that holds at most `capacity` bytes of entries (keys, values
    /// and bookkeeping; at least [`MIN_CAPACITY`](Self::MIN_CAPACITY)),
    /// evicting the least recently used when full. A single value larger
    /// than the whole capacity is not kept.
    #[must_use]
    pub fn new(capacity: u64) -> Self {
        let hasher = RandomState::new();
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Shard {
                    map: LinkedHashMap::with_hasher(hasher.clone()),
                    ..Shard::default()
                })
            })
            .collect();
        Self {
            inner: Arc::new(Inner {
                shards,
                hasher,
                capacity: capacity.max(Self::MIN_CAPACITY),
                used: AtomicU64::new(0),
                evictions: AtomicU64::new(0),
                next_victim: AtomicUsize::new(0),
                origin: Instant::now(),
            }),
        }
    }

    /// How many live entries were evicted to make room, since the store
    /// was made (shared by its clones). Anything above zero means the
    /// guard forgot keys before their time: see
    /// [When it is full](Self#when-it-is-full).
    #[must_use]
    pub fn evictions(&self) -> u64 {
        self.inner.evictions.load(Ordering::Relaxed)
    }

    /// Bytes held, by the store's weighing (entries past their time to
    /// live swept out first).
    #[must_use]
    pub fn weighted_size(&self) -> u64 {
        self.sweep_all();
        self.inner.used.load(Ordering::Relaxed)
    }

    /// Live entries (entries past their time to live swept out first).
    #[must_use]
    pub fn len(&self) -> u64 {
        self.sweep_all()
    }

    /// Whether no entry is live.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sweeps every shard of its expired entries: the live entries left.
    fn sweep_all(&self) -> u64 {
        let now = Instant::now();
        let mut live = 0;
        for at in 0..SHARDS {
            let mut shard = self.inner.lock(at);
            shard.sweep(now, &self.inner.used, 0);
            live += shard.map.len() as u64;
        }
        live
    }

    /// The bytes held under `key`, if it is live (a key of a rate limiter
    /// reads as absent). A read: it does not count as the key's use.
    pub(crate) fn peek(&self, key: &str) -> Option<Bytes> {
        let hash = self.inner.hasher.hash_one(key);
        let shard = self.inner.lock(shard_of(hash));
        let (_, e) = shard.map.raw_entry().from_key_hashed_nocheck(hash, key)?;
        match &e.value {
            Value::Bytes(b) if e.expires_at > Instant::now() => Some(b.clone()),
            _ => None,
        }
    }

    /// Runs `f` on the live entry under `key` (if any) under its shard's
    /// lock, and applies the [`Op`] it returns.
    fn compute<T>(&self, key: &str, f: impl FnOnce(Option<&Entry>, Instant) -> (Op, T)) -> T {
        let inner = &*self.inner;
        let hash = inner.hasher.hash_one(key);
        let at = shard_of(hash);
        let mut guard = inner.lock(at);
        let shard = &mut *guard;
        // The clock is read under the key's lock, so calls on one key see
        // time move forward in the order they run.
        let now = Instant::now();
        let (result, written) = match shard.map.raw_entry_mut().from_key_hashed_nocheck(hash, key) {
            RawEntryMut::Occupied(mut o) => {
                let live = o.get().expires_at > now;
                let (op, result) = f(live.then(|| o.get()), now);
                let old = weigh(key, o.get());
                match op {
                    Op::Put(e) => {
                        let new = weigh(key, &e);
                        *o.get_mut() = e;
                        o.to_back();
                        inner.used.fetch_add(new, Ordering::Relaxed);
                        inner.used.fetch_sub(old, Ordering::Relaxed);
                        (result, Some(new))
                    }
                    Op::Remove => {
                        o.remove();
                        inner.used.fetch_sub(old, Ordering::Relaxed);
                        (result, None)
                    }
                    Op::Nop if live => {
                        o.to_back();
                        (result, None)
                    }
                    // Past its time: gone, as if it had been swept.
                    Op::Nop => {
                        o.remove();
                        inner.used.fetch_sub(old, Ordering::Relaxed);
                        (result, None)
                    }
                }
            }
            RawEntryMut::Vacant(v) => match f(None, now) {
                (Op::Put(e), result) => {
                    let new = weigh(key, &e);
                    v.insert_hashed_nocheck(hash, Arc::from(key), e);
                    inner.used.fetch_add(new, Ordering::Relaxed);
                    (result, Some(new))
                }
                (Op::Nop | Op::Remove, result) => (result, None),
            },
        };
        if let Some(weight) = written {
            let expires_at = shard.map.back().map(|(_, e)| e.expires_at);
            shard.soonest = match (shard.soonest, expires_at) {
                (Some(s), Some(e)) => Some(s.min(e)),
                (s, e) => s.or(e),
            };
            shard.writes += 1;
            let len = shard.map.len();
            shard.sweep(now, &inner.used, len / 4 + 16);
            if inner.used.load(Ordering::Relaxed) > inner.capacity {
                inner.make_room(at, guard, key, weight, now);
            }
        }
        result
    }

    fn with_bytes<T>(&self, key: &str, f: impl FnOnce(Option<&Bytes>, Instant) -> (Op, T)) -> T {
        self.compute(key, |cur, now| match cur.map(|e| &e.value) {
            Some(Value::Bytes(b)) => f(Some(b), now),
            // A key of another kind is never equal to bytes: leave it alone.
            Some(_) => f(Some(&Bytes::new()), now),
            None => f(None, now),
        })
    }

    fn count(
        &self,
        key: &str,
        step: impl FnOnce(Option<Value>, u64) -> (Value, Duration, RateDecision),
    ) -> RateDecision {
        self.compute(key, |cur, now| {
            let now_us =
                u64::try_from(now.saturating_duration_since(self.inner.origin).as_micros())
                    .unwrap_or(u64::MAX);
            let (value, ttl, decision) = step(cur.map(|e| e.value.clone()), now_us);
            (
                Op::Put(Entry {
                    value,
                    expires_at: deadline(now, ttl),
                }),
                decision,
            )
        })
    }
}

/// The shard of a key hashed to `hash`: bits the map's own use of the
/// hash (its low bits for the slot, its top 7 for the tag) leaves alone.
fn shard_of(hash: u64) -> usize {
    (hash >> 40) as usize % SHARDS
}

impl Inner {
    fn lock(&self, at: usize) -> MutexGuard<'_, Shard> {
        // A panic under the lock leaves the shard consistent: each change
        // is a single map operation.
        self.shards[at]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Evicts until the store is within its capacity: first the least
    /// recently used of the new key's own shard (`own`, still locked),
    /// never the key just written, then the other shards' in turn, one
    /// lock at a time. A key that alone outweighs the capacity is dropped.
    fn make_room(
        &self,
        at: usize,
        mut own: MutexGuard<'_, Shard>,
        key: &str,
        weight: u64,
        now: Instant,
    ) {
        if weight > self.capacity {
            if let Some(e) = own.map.remove(key) {
                self.used.fetch_sub(weigh(key, &e), Ordering::Relaxed);
            }
            return;
        }
        // Past entries first: they cost no one anything. (Amortized as
        // any sweep: a store that stays full sweeps a shard once per
        // sixteenth of its entries written, not at every write.)
        let len = own.map.len();
        own.sweep(now, &self.used, len / 16 + 1);
        while self.over() && own.map.len() > 1 {
            self.evict_front(&mut own, now);
        }
        drop(own);
        for _ in 0..SHARDS - 1 {
            if !self.over() {
                return;
            }
            let victim = self.next_victim.fetch_add(1, Ordering::Relaxed) % SHARDS;
            if victim == at {
                continue;
            }
            let mut shard = self.lock(victim);
            let len = shard.map.len();
            shard.sweep(now, &self.used, len / 16 + 1);
            while self.over() && self.evict_front(&mut shard, now) {}
        }
    }

    fn over(&self) -> bool {
        self.used.load(Ordering::Relaxed) > self.capacity
    }

    /// Removes `shard`'s least recently used entry, counting it when it
    /// was live. `false` when the shard is empty.
    fn evict_front(&self, shard: &mut Shard, now: Instant) -> bool {
        let Some((key, e)) = shard.map.pop_front() else {
            return false;
        };
        self.used.fetch_sub(weigh(&key, &e), Ordering::Relaxed);
        if e.expires_at > now {
            self.evictions.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("norepeat_memory_evictions_total").increment(1);
        }
        true
    }
}

fn bytes_entry(value: &[u8], now: Instant, ttl: Duration) -> Entry {
    Entry {
        value: Value::Bytes(Bytes::copy_from_slice(value)),
        expires_at: deadline(now, ttl.max(Duration::from_millis(1))),
    }
}

/// The longest an entry lives: ten years, far past any process's life,
/// and far inside what `Instant` can add.
const LONGEST_TTL: Duration = Duration::from_secs(10 * 365 * 86_400);

/// When an entry written at `now` for `ttl` expires: a TTL past
/// [`LONGEST_TTL`] (`Duration::MAX` as a lease or a retention) is that
/// long, never an overflow.
fn deadline(now: Instant, ttl: Duration) -> Instant {
    now + ttl.min(LONGEST_TTL)
}

impl KeyValueStore for MemoryStore {
    async fn execute(&self, op: KeyOp<'_>) -> Result<KeyReply, StoreError> {
        Ok(match op {
            KeyOp::PutIfAbsent { key, value, ttl } => {
                KeyReply::Held(self.with_bytes(key, |cur, now| match cur {
                    Some(existing) => (Op::Nop, Some(existing.clone())),
                    None => (Op::Put(bytes_entry(value, now, ttl)), None),
                }))
            }
            KeyOp::DeleteIfEquals { key, expected } => {
                KeyReply::Changed(self.with_bytes(key, |cur, _| match cur {
                    Some(v) if v.as_ref() == expected => (Op::Remove, true),
                    _ => (Op::Nop, false),
                }))
            }
            KeyOp::ExpireIfEquals { key, expected, ttl } => {
                KeyReply::Changed(self.with_bytes(key, |cur, now| match cur {
                    Some(v) if v.as_ref() == expected => {
                        (Op::Put(bytes_entry(expected, now, ttl)), true)
                    }
                    _ => (Op::Nop, false),
                }))
            }
            KeyOp::ReplaceIfEquals {
                key,
                expected,
                value,
                ttl,
            } => KeyReply::Changed(self.with_bytes(key, |cur, now| match cur {
                Some(v) if v.as_ref() == expected => (Op::Put(bytes_entry(value, now, ttl)), true),
                _ => (Op::Nop, false),
            })),
            KeyOp::Get { key } => {
                KeyReply::Held(self.with_bytes(key, |cur, _| (Op::Nop, cur.cloned())))
            }
        })
    }

    fn kind(&self) -> &'static str {
        "memory"
    }
}

impl RateStore for MemoryStore {
    async fn rate(&self, op: RateOp<'_>) -> Result<RateDecision, StoreError> {
        Ok(match op {
            RateOp::FixedWindow { key, limit, window } => {
                let window_us = micros(window);
                self.count(key, |cur, now| {
                    let state = match cur {
                        Some(Value::Fixed(s)) => Some(s),
                        _ => None,
                    };
                    let (s, d) = arithmetic::fixed_window(state, now, limit, window_us);
                    let ttl = Duration::from_micros(s.window_end.saturating_sub(now));
                    (Value::Fixed(s), ttl, d)
                })
            }
            RateOp::SlidingWindow { key, limit, window } => {
                let window_us = micros(window);
                self.count(key, |cur, now| {
                    let state = match cur {
                        Some(Value::Sliding(s)) => Some(s),
                        _ => None,
                    };
                    let (s, d) = arithmetic::sliding_window(state, now, limit, window_us);
                    // Expires at a fixed time: a refused call never pushes it on.
                    let until = arithmetic::sliding_expires_at(&s, window_us);
                    (
                        Value::Sliding(s),
                        Duration::from_micros(until.saturating_sub(now).max(1)),
                        d,
                    )
                })
            }
            RateOp::Gcra {
                key,
                emission,
                burst,
            } => {
                let emission_us = micros(emission);
                self.count(key, |cur, now| {
                    let tat = match cur {
                        Some(Value::Gcra(t)) => Some(t),
                        _ => None,
                    };
                    let (tat, d) = arithmetic::gcra(tat, now, emission_us, burst);
                    let ttl = Duration::from_micros(tat.saturating_sub(now).max(1));
                    (Value::Gcra(tat), ttl, d)
                })
            }
        })
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::KeyValueStoreExt;

    /// Every rate algorithm takes `Duration::MAX` as its window or
    /// emission interval without panicking (the entry's deadline
    /// saturates).
    #[tokio::test]
    async fn the_longest_durations_saturate() {
        use crate::store::RateStoreExt;
        let s = MemoryStore::default();
        let max = Duration::MAX;
        assert!(s.fixed_window("f", 2, max).await.unwrap().allowed);
        assert!(s.sliding_window("s", 2, max).await.unwrap().allowed);
        assert!(s.gcra("g", max, 2).await.unwrap().allowed);
        let _ = s.gcra("g", max, 2).await.unwrap();
        assert!(s.put_if_absent("k", b"v", max).await.unwrap().is_none());
        assert_eq!(s.peek("k").as_deref(), Some(&b"v"[..]));
    }

    #[tokio::test]
    async fn entries_expire() {
        let s = MemoryStore::default();
        assert!(
            s.put_if_absent("k", b"a", Duration::from_millis(20))
                .await
                .unwrap()
                .is_none()
        );
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert!(
            s.put_if_absent("k", b"b", Duration::from_millis(20))
                .await
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn compare_operations_check_the_owner() {
        let s = MemoryStore::default();
        let ttl = Duration::from_secs(5);
        s.put_if_absent("k", b"a", ttl).await.unwrap();
        assert!(!s.expire_if_equals("k", b"b", ttl).await.unwrap());
        assert!(s.expire_if_equals("k", b"a", ttl).await.unwrap());
        assert!(!s.replace_if_equals("k", b"b", b"c", ttl).await.unwrap());
        assert!(s.replace_if_equals("k", b"a", b"c", ttl).await.unwrap());
        assert!(!s.delete_if_equals("k", b"a").await.unwrap());
        assert!(s.delete_if_equals("k", b"c").await.unwrap());
        assert!(!s.delete_if_equals("k", b"c").await.unwrap());
    }

    /// A value that alone outweighs the whole capacity is not kept, and
    /// takes nothing else with it.
    #[tokio::test]
    async fn a_value_larger_than_the_store_is_not_kept() {
        let s = MemoryStore::new(0);
        let ttl = Duration::from_secs(60);
        s.put_if_absent("small", b"v", ttl).await.unwrap();
        let huge = vec![0u8; usize::try_from(MemoryStore::MIN_CAPACITY).unwrap() + 1];
        assert!(s.put_if_absent("huge", &huge, ttl).await.unwrap().is_none());
        assert_eq!(s.peek("huge"), None);
        assert_eq!(s.peek("small").as_deref(), Some(&b"v"[..]));
        assert_eq!(s.evictions(), 0);
        assert_eq!(
            s.weighted_size(),
            weigh("small", &bytes_entry(b"v", Instant::now(), ttl))
        );
    }

    /// The least recently used goes first: a key read again is kept over
    /// one written after it and never read.
    #[tokio::test]
    async fn a_key_in_use_outlives_one_left_alone() {
        let s = MemoryStore::new(0);
        let ttl = Duration::from_secs(60);
        s.put_if_absent("used", b"v", ttl).await.unwrap();
        s.put_if_absent("idle", b"v", ttl).await.unwrap();
        // Enough keys to go round every shard several times over.
        for i in 0..5_000 {
            s.put_if_absent("used", b"again", ttl).await.unwrap();
            s.put_if_absent(&format!("k{i}"), b"v", ttl).await.unwrap();
        }
        assert_eq!(s.peek("used").as_deref(), Some(&b"v"[..]));
        assert_eq!(s.peek("idle"), None);
        assert!(s.weighted_size() <= MemoryStore::MIN_CAPACITY);
    }

    #[tokio::test]
    async fn capacity_is_bounded_in_bytes() {
        let s = MemoryStore::new(0);
        for i in 0..1_000 {
            s.put_if_absent(&format!("k{i}"), b"v", Duration::from_secs(60))
                .await
                .unwrap();
        }
        // 64 KiB of entries of about 133 bytes: some 490.
        assert!(s.weighted_size() <= MemoryStore::MIN_CAPACITY);
        assert!((400..1_000).contains(&s.len()), "{} entries", s.len());
    }
}
