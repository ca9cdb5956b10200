// Over 400 lines on purpose: one store and its tests; 65 lines are tests.
//! The in-process store: bounded in bytes, every entry expiring.

use super::rate::arithmetic::{self, FixedState, SlidingState};
use super::{KeyOp, KeyReply, KeyValueStore, RateDecision, RateOp, RateStore, StoreError};
use bytes::Bytes;
use moka::notification::RemovalCause;
use moka::ops::compute::Op;
use moka::policy::EvictionPolicy;
use moka::sync::Cache;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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

impl Entry {
    fn live(self, now: Instant) -> Option<Self> {
        (self.expires_at > now).then_some(self)
    }
}

/// Bytes an entry costs beyond its key and value: the entry itself and
/// moka's bookkeeping (hash table slot, queue nodes, timer wheel), rounded
/// up.
const ENTRY_OVERHEAD: usize = 128;

/// An entry's weight: its key, its value and [`ENTRY_OVERHEAD`], in bytes.
fn weigh(key: &Arc<str>, e: &Entry) -> u32 {
    let value = match &e.value {
        Value::Bytes(b) => b.len(),
        Value::Gcra(_) | Value::Fixed(_) | Value::Sliding(_) => 0,
    };
    u32::try_from(key.len() + value + ENTRY_OVERHEAD).unwrap_or(u32::MAX)
}

struct PerEntryTtl;

impl moka::Expiry<Arc<str>, Entry> for PerEntryTtl {
    fn expire_after_create(&self, _: &Arc<str>, e: &Entry, now: Instant) -> Option<Duration> {
        Some(e.expires_at.saturating_duration_since(now))
    }
    fn expire_after_update(
        &self,
        _: &Arc<str>,
        e: &Entry,
        now: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        Some(e.expires_at.saturating_duration_since(now))
    }
}

/// A bounded in-memory [`Store`](super::Store): the embedded default, and the local
/// fallback that keeps catching one instance's own repeats while Redis is
/// away.
///
/// Each operation runs under moka's per-key lock, so it is atomic against
/// every other operation on the same key. Entries expire at their own time
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
/// estimate of moka's, rounded up, not a measurement), so a fingerprint or
/// a token counts under 200 bytes and the default 64 MiB holds over
/// 330,000 of them (64 MiB / 200 B).
///
/// A new key is always taken. To make room, the entries used least
/// recently are evicted (LRU). A frequency-based policy would keep a
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
    cache: Cache<Arc<str>, Entry>,
    origin: Instant,
    evictions: Arc<AtomicU64>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("entries", &self.cache.entry_count())
            .field("bytes", &self.cache.weighted_size())
            .field("evictions", &self.evictions.load(Ordering::Relaxed))
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
        let evictions = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&evictions);
        Self {
            cache: Cache::builder()
                .max_capacity(capacity.max(Self::MIN_CAPACITY))
                .weigher(weigh)
                .eviction_policy(EvictionPolicy::lru())
                .expire_after(PerEntryTtl)
                .eviction_listener(move |_key, entry: Entry, cause| {
                    // `Size`: pushed out for room. An entry already past its
                    // time to live was not lost, whatever moka calls it.
                    if cause == RemovalCause::Size && entry.expires_at > Instant::now() {
                        counted.fetch_add(1, Ordering::Relaxed);
                        metrics::counter!("norepeat_memory_evictions_total").increment(1);
                    }
                })
                .build(),
            origin: Instant::now(),
            evictions,
        }
    }

    /// How many live entries were evicted to make room, since the store
    /// was made (shared by its clones). Anything above zero means the
    /// guard forgot keys before their time: see
    /// [When it is full](Self#when-it-is-full).
    #[must_use]
    pub fn evictions(&self) -> u64 {
        self.cache.run_pending_tasks();
        self.evictions.load(Ordering::Relaxed)
    }

    /// Bytes held, by the store's weighing (approximate: moka counts
    /// lazily).
    #[must_use]
    pub fn weighted_size(&self) -> u64 {
        self.cache.run_pending_tasks();
        self.cache.weighted_size()
    }

    /// Live entries (approximate: moka counts lazily).
    #[must_use]
    pub fn len(&self) -> u64 {
        self.cache.run_pending_tasks();
        self.cache.entry_count()
    }

    /// Whether no entry is live.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes held under `key`, if it is live (a key of a rate limiter
    /// reads as absent). A plain read: no lock, no write.
    pub(crate) fn peek(&self, key: &str) -> Option<Bytes> {
        match self.cache.get(key)?.live(Instant::now())?.value {
            Value::Bytes(b) => Some(b),
            _ => None,
        }
    }

    /// Runs `f` on the live entry under `key` (if any) under the key's lock.
    fn compute<T>(&self, key: &str, f: impl FnOnce(Option<Entry>, Instant) -> (Op<Entry>, T)) -> T {
        let mut out = None;
        self.cache
            .entry(Arc::from(key))
            .and_compute_with(|current| {
                let now = Instant::now();
                let current = current.and_then(|e| e.into_value().live(now));
                let (op, result) = f(current, now);
                out = Some(result);
                op
            });
        // moka runs the closure exactly once per call.
        out.expect("and_compute_with runs its closure")
    }

    fn with_bytes<T>(
        &self,
        key: &str,
        f: impl FnOnce(Option<&Bytes>, Instant) -> (Op<Entry>, T),
    ) -> T {
        self.compute(key, |cur, now| match cur {
            Some(Entry {
                value: Value::Bytes(b),
                ..
            }) => f(Some(&b), now),
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
            // The clock is read under the key's lock, so calls on one key see
            // time move forward in the order they run.
            let now_us = u64::try_from(now.saturating_duration_since(self.origin).as_micros())
                .unwrap_or(u64::MAX);
            let (value, ttl, decision) = step(cur.map(|e| e.value), now_us);
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

fn bytes_entry(value: &[u8], now: Instant, ttl: Duration) -> Entry {
    Entry {
        value: Value::Bytes(Bytes::copy_from_slice(value)),
        expires_at: deadline(now, ttl.max(Duration::from_millis(1))),
    }
}

/// The longest an entry lives: ten years, far past any process's life,
/// and far inside what moka's clock (nanoseconds in 64 bits) can add.
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
