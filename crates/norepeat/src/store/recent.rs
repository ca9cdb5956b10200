//! The keys a primary store took lately through this process: what
//! [`Fallback`](super::Fallback) answers from when the primary fails on a
//! key its local memory never saw.
//!
//! A fixed table of slots, one per key hash: remembering a key costs one
//! hash and one short lock, never an allocation, and a newer key that
//! lands in the same slot replaces the older one. So it remembers less than
//! it was told (the older of two keys sharing a slot is forgotten), never
//! more: a slot matches only the 64-bit hash it was written with, and only
//! until the key's time to live, counted from before the primary was asked
//! (never later than the primary's own copy expires).

use bytes::Bytes;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, PoisonError};

/// The longest value remembered, in bytes: a fingerprint's or a lease's
/// owner, a used token's mark, an in-progress idempotency record. A longer
/// one (a stored response) is not kept.
pub(super) const MAX_VALUE: usize = 32;

/// Slots in the table: 16,384 (64 bytes each, 1 MiB). A key stays until
/// another lands in its slot, on average 16,384 new keys later: about a
/// minute at 300 new keys a second, half a second at 30,000.
const SLOTS: usize = 1 << 14;

#[derive(Clone, Copy)]
struct Slot {
    hash: u64,
    /// Milliseconds on the owner's clock until which the key is held; 0 for
    /// a free slot.
    until_ms: u64,
    len: u8,
    value: [u8; MAX_VALUE],
}

impl Slot {
    const FREE: Slot = Slot {
        hash: 0,
        until_ms: 0,
        len: 0,
        value: [0; MAX_VALUE],
    };

    /// `value` under `hash` until `until_ms`; a free slot if the value is
    /// too long to keep.
    fn holding(hash: u64, value: &[u8], until_ms: u64) -> Slot {
        match u8::try_from(value.len()) {
            Ok(len) if value.len() <= MAX_VALUE => {
                let mut s = Slot {
                    hash,
                    until_ms,
                    len,
                    value: [0; MAX_VALUE],
                };
                s.value[..value.len()].copy_from_slice(value);
                s
            }
            _ => Slot::FREE,
        }
    }

    fn value(&self) -> &[u8] {
        &self.value[..usize::from(self.len)]
    }

    fn holds(&self, hash: u64, now_ms: u64) -> bool {
        self.hash == hash && now_ms < self.until_ms
    }
}

/// What an owner-checked operation did to a key (see [`Recent::changed`]).
#[derive(Debug, Clone, Copy)]
pub(super) enum Change<'a> {
    /// Deleted.
    Deleted,
    /// Held until `until_ms`, with the same value.
    Expires {
        /// The new end.
        until_ms: u64,
    },
    /// Replaced by `value` until `until_ms`.
    Replaced {
        /// The new value.
        value: &'a [u8],
        /// The new end.
        until_ms: u64,
    },
}

/// The table (see the module's docs).
pub(super) struct Recent {
    slots: Box<[Mutex<Slot>]>,
    hasher: RandomState,
}

impl std::fmt::Debug for Recent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recent")
            .field("slots", &self.slots.len())
            .finish_non_exhaustive()
    }
}

impl Recent {
    pub(super) fn new() -> Self {
        Self {
            slots: (0..SLOTS).map(|_| Mutex::new(Slot::FREE)).collect(),
            hasher: RandomState::new(),
        }
    }

    fn slot(&self, key: &str) -> (u64, std::sync::MutexGuard<'_, Slot>) {
        let hash = self.hasher.hash_one(key);
        // The low bits pick the slot; the whole hash is kept to match.
        let slot = &self.slots[usize::try_from(hash).unwrap_or(0) % SLOTS];
        (hash, slot.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Remembers that `key` holds `value` until `until_ms` (a value longer
    /// than [`MAX_VALUE`] is not remembered, and forgets what the slot held).
    pub(super) fn put(&self, key: &str, value: &[u8], until_ms: u64) {
        let (hash, mut slot) = self.slot(key);
        *slot = Slot::holding(hash, value, until_ms);
    }

    /// The value `key` holds at `now_ms`, if it is remembered.
    pub(super) fn get(&self, key: &str, now_ms: u64) -> Option<Bytes> {
        let (hash, slot) = self.slot(key);
        slot.holds(hash, now_ms)
            .then(|| Bytes::copy_from_slice(slot.value()))
    }

    /// An owner-checked operation on `key` succeeded somewhere (or may
    /// have): if the key is remembered with the `expected` value, `change`
    /// is applied to it. A replacement too long to keep forgets the key.
    pub(super) fn changed(&self, key: &str, expected: &[u8], change: Change<'_>, now_ms: u64) {
        let (hash, mut slot) = self.slot(key);
        if !slot.holds(hash, now_ms) || slot.value() != expected {
            return;
        }
        match change {
            Change::Deleted => *slot = Slot::FREE,
            Change::Expires { until_ms } => slot.until_ms = until_ms,
            Change::Replaced { value, until_ms } => *slot = Slot::holding(hash, value, until_ms),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_held_until_its_end_and_only_with_its_value() {
        let r = Recent::new();
        r.put("k", b"owner-1", 100);
        assert_eq!(r.get("k", 99).as_deref(), Some(&b"owner-1"[..]));
        assert_eq!(r.get("k", 100), None, "ended");
        assert_eq!(r.get("other", 0), None);

        // Another owner's release changes nothing; the owner's does.
        r.changed("k", b"owner-2", Change::Deleted, 0);
        assert!(r.get("k", 0).is_some());
        r.changed("k", b"owner-1", Change::Deleted, 0);
        assert_eq!(r.get("k", 0), None);
    }

    #[test]
    fn renewals_and_replacements_follow_the_owner() {
        let r = Recent::new();
        r.put("k", b"a", 100);
        r.changed("k", b"a", Change::Expires { until_ms: 500 }, 50);
        assert!(r.get("k", 400).is_some());
        r.changed(
            "k",
            b"a",
            Change::Replaced {
                value: b"done",
                until_ms: 900,
            },
            60,
        );
        assert_eq!(r.get("k", 800).as_deref(), Some(&b"done"[..]));
        // A value too long to keep (a stored response) forgets the key.
        let long = [7u8; MAX_VALUE + 1];
        r.changed(
            "k",
            b"done",
            Change::Replaced {
                value: &long,
                until_ms: 900,
            },
            60,
        );
        assert_eq!(r.get("k", 61), None);
        r.put("long", &long, 900);
        assert_eq!(r.get("long", 0), None);
    }

    #[test]
    fn a_full_table_forgets_older_keys_and_never_mixes_two_up() {
        let r = Recent::new();
        let n = SLOTS * 4;
        for i in 0..n {
            r.put(&format!("key-{i}"), format!("{i}").as_bytes(), 1_000);
        }
        let mut kept = 0;
        for i in 0..n {
            if let Some(v) = r.get(&format!("key-{i}"), 0) {
                assert_eq!(v, format!("{i}").as_bytes(), "key-{i}");
                kept += 1;
            }
        }
        assert!(kept <= SLOTS, "{kept}");
        // The last key written is always there.
        assert!(r.get(&format!("key-{}", n - 1), 0).is_some());
    }
}
