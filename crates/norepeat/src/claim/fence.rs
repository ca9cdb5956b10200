//! The value a claim holds its key with, and every owner-checked change
//! made with it: renew, complete, release.
//!
//! A claim renewed by its TTL (a fingerprint's, a window's) keeps one value
//! for its whole life. A claim whose lease deadline is inside its value (an
//! idempotency record, a once-mode claim) writes the value again at every
//! renewal, with a later deadline, so the record itself says whether its
//! owner still lives after the process that wrote it is gone. The fence
//! follows the value: it knows what the store holds for this claim, and a
//! renewal whose answer never came (its budget ran out, the connection
//! broke) leaves both the old and the new value as what the store may
//! hold. Every later owner-checked change tries each, newest first, so an
//! unanswered renewal never makes a claim look lost.
//!
//! One change at a time per claim: the values sit behind an async lock,
//! held across the store call. A completion waits for a renewal in flight
//! (at most the renewal's budget); the shared renewer never waits for a
//! completion (it skips a claim whose lock is taken: that claim is being
//! completed or released).

use crate::store::{KeyValueStore, KeyValueStoreExt, StoreError};
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;

/// Rewrites a value with a new lease deadline (wall-clock milliseconds);
/// `None` when the value is not one this restamp knows.
pub(crate) type Restamp = fn(&[u8], u64) -> Option<Vec<u8>>;

/// How many values an unanswered renewal may leave behind before the
/// oldest is forgotten.
const MAX_VALUES: usize = 4;

/// What the store may hold for a claim.
struct Values {
    /// The value last known to be written.
    known: Bytes,
    /// The values of renewals whose answer did not come, oldest first
    /// (empty, and so not allocated, for nearly every claim).
    unsure: Vec<Bytes>,
}

impl Values {
    fn new(known: Bytes) -> tokio::sync::Mutex<Self> {
        tokio::sync::Mutex::new(Self {
            known,
            unsure: Vec::new(),
        })
    }

    fn newest_first(&self) -> impl Iterator<Item = &Bytes> {
        self.unsure.iter().rev().chain(std::iter::once(&self.known))
    }
}

/// A claim's value, shared by the claim, its renewal and a transaction
/// that completes it.
pub(crate) struct Fence {
    /// What the store may hold for this claim.
    values: tokio::sync::Mutex<Values>,
    /// How a renewal rewrites the value (`None`: it only extends the TTL).
    restamp: Option<Restamp>,
    /// The lease a renewal grants, counted from the renewal.
    lease: Duration,
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fence")
            .field("stamped", &self.restamp.is_some())
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl Fence {
    /// A claim whose value never changes: renewal extends its TTL.
    pub(crate) fn fixed(value: Bytes, lease: Duration) -> Arc<Self> {
        Arc::new(Self {
            values: Values::new(value),
            restamp: None,
            lease,
        })
    }

    /// A claim whose value carries its lease deadline: renewal rewrites it
    /// with `restamp`, `lease` from the renewal.
    pub(crate) fn stamped(value: Bytes, restamp: Restamp, lease: Duration) -> Arc<Self> {
        Arc::new(Self {
            values: Values::new(value),
            restamp: Some(restamp),
            lease,
        })
    }

    /// The values the store may hold for this claim, newest first, held
    /// so that no renewal changes them until the guard is dropped: for a
    /// change made outside this type (a completion inside a transaction).
    pub(crate) async fn lock(&self) -> FenceGuard<'_> {
        FenceGuard(self.values.lock().await)
    }

    /// Extends the claim (a new lease from now) if the store still holds
    /// one of its values. `wait`: wait for a change in flight; otherwise a
    /// claim being changed is skipped (answers `true`: it is not lost).
    pub(crate) async fn renew<S: KeyValueStore>(
        &self,
        store: &S,
        key: &str,
        ttl: Duration,
        wait: bool,
    ) -> Result<bool, StoreError> {
        let mut values = if wait {
            self.values.lock().await
        } else {
            match self.values.try_lock() {
                Ok(v) => v,
                Err(_) => return Ok(true),
            }
        };
        let Some(restamp) = self.restamp else {
            for v in values.newest_first() {
                if store.expire_if_equals(key, v, ttl).await? {
                    return Ok(true);
                }
            }
            return Ok(false);
        };
        let deadline = crate::clock::now_ms()
            .saturating_add(u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX));
        let newest = values.newest_first().next().cloned().unwrap_or_default();
        let Some(next) = restamp(&newest, deadline) else {
            return Ok(false);
        };
        let next = Bytes::from(next);
        let tried: Vec<Bytes> = values.newest_first().cloned().collect();
        // Until the store answers, it may hold the new value: if this
        // future is dropped (its budget ran out) the value stays known.
        values.unsure.push(next.clone());
        if values.unsure.len() >= MAX_VALUES {
            values.unsure.remove(0);
        }
        for v in &tried {
            if store.replace_if_equals(key, v, &next, ttl).await? {
                values.known = next;
                values.unsure.clear();
                return Ok(true);
            }
        }
        // None of them is in the store: the new value was not written.
        values.unsure.pop();
        Ok(false)
    }
}

/// The values a claim's key may hold, locked against renewal (see
/// [`Fence::lock`]).
pub(crate) struct FenceGuard<'a>(tokio::sync::MutexGuard<'a, Values>);

impl FenceGuard<'_> {
    /// Newest first.
    pub(crate) fn newest_first(&self) -> impl Iterator<Item = &Bytes> {
        self.0.newest_first()
    }
}

/// `ms` (wall clock, milliseconds since the Unix epoch) as a lease deadline
/// kept in 32 bits: hundredths of a second, rounded up, modulo 2^32 (497
/// days). Compare two with [`passed`], which reads them right within 248
/// days of each other.
pub(crate) fn stamp(ms: u64) -> u32 {
    // Truncation is the point: the stamp wraps.
    #[allow(clippy::cast_possible_truncation)]
    let s = ms.div_ceil(10) as u32;
    s
}

/// Whether the lease deadline `deadline` (a [`stamp`]) is more than
/// `slack_ms` behind the wall clock `now_ms`.
pub(crate) fn passed(deadline: u32, now_ms: u64, slack_ms: u64) -> bool {
    let now = stamp(now_ms.saturating_sub(slack_ms));
    // A signed difference of two wrapping stamps.
    #[allow(clippy::cast_possible_wrap)]
    let ahead = now.wrapping_sub(deadline) as i32;
    ahead > 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    #[test]
    fn stamps_compare_across_the_wrap() {
        let t = 1_800_000_000_000u64;
        assert!(!passed(stamp(t + 5_000), t, 0));
        assert!(passed(stamp(t), t + 20, 0));
        assert!(!passed(stamp(t), t + 20, 1_000), "within the slack");
        // Around the wrap of the 32-bit stamp.
        let wrap = (1u64 << 32) * 10;
        assert!(passed(stamp(wrap - 1_000), wrap + 1_000, 0));
        assert!(!passed(stamp(wrap + 1_000), wrap - 1_000, 0));
    }

    fn restamp_last8(v: &[u8], deadline: u64) -> Option<Vec<u8>> {
        let mut out = v.get(..v.len().checked_sub(8)?)?.to_vec();
        out.extend_from_slice(&deadline.to_be_bytes());
        Some(out)
    }

    /// A renewal rewrites the value; a change after it uses the new one.
    /// A renewal whose answer was lost (its future dropped after the write
    /// was sent) leaves both values known, so the next change still finds
    /// the claim.
    #[tokio::test]
    async fn a_renewal_moves_the_value_and_an_unanswered_one_is_not_a_loss() {
        let store = MemoryStore::default();
        let ttl = Duration::from_secs(30);
        let first = Bytes::from(restamp_last8(b"owner-a.01234567", 1).unwrap());
        assert_eq!(store.put_if_absent("k", &first, ttl).await.unwrap(), None);
        let fence = Fence::stamped(first.clone(), restamp_last8, Duration::from_secs(10));
        assert!(fence.renew(&store, "k", ttl, true).await.unwrap());
        let held = store.put_if_absent("k", b"x", ttl).await.unwrap().unwrap();
        assert_ne!(held, first, "the renewal wrote a new deadline");
        assert_eq!(fence.lock().await.newest_first().next(), Some(&held));

        // A write the fence does not know of (as if a renewal landed and
        // its answer was lost): the fence still knows the value before.
        {
            let mut values = fence.values.lock().await;
            let landed = Bytes::from(restamp_last8(&held, 99).unwrap());
            assert!(
                store
                    .replace_if_equals("k", &held, &landed, ttl)
                    .await
                    .unwrap()
            );
            values.unsure.push(landed);
        }
        assert!(fence.renew(&store, "k", ttl, true).await.unwrap());
        assert_eq!(fence.lock().await.newest_first().count(), 1);

        // Someone else's value: lost, and nothing is written.
        let theirs = b"someone-else....";
        {
            let values = fence.lock().await;
            let ours = values.newest_first().next().unwrap().clone();
            assert!(
                store
                    .replace_if_equals("k", &ours, theirs, ttl)
                    .await
                    .unwrap()
            );
        }
        assert!(!fence.renew(&store, "k", ttl, true).await.unwrap());
        assert_eq!(
            store
                .put_if_absent("k", b"x", ttl)
                .await
                .unwrap()
                .as_deref(),
            Some(&theirs[..])
        );
    }
}
