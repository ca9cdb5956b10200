//! The embedded store when it is full: it stays a guard.

// Helpers outside `#[test]` functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used)]

use norepeat::store::KeyValueStoreExt;
use norepeat::store::MemoryStore;
use std::time::Duration;

const TTL: Duration = Duration::from_secs(60);

/// Fills `store` with `n` distinct keys, each read back a few times (a
/// flood of keys that look "popular" to a frequency-based policy).
async fn flood(store: &MemoryStore, n: usize) {
    for i in 0..n {
        let key = format!("flood-{i}");
        store.put_if_absent(&key, b"owner", TTL).await.unwrap();
        store.put_if_absent(&key, b"again", TTL).await.unwrap();
    }
}

/// A full store admits every new key and catches its duplicate, even after
/// housekeeping ran in between: eviction takes the least recently used
/// entries, never the newcomer.
#[tokio::test]
async fn a_full_store_keeps_admitting_new_keys_and_catches_their_duplicates() {
    // 4 KiB is raised to the smallest capacity, 64 KiB: a few hundred keys.
    let store = MemoryStore::new(4 * 1024);
    flood(&store, 10_000).await;
    for i in 0..20 {
        let key = format!("new-{i}");
        assert_eq!(
            store.put_if_absent(&key, b"first", TTL).await.unwrap(),
            None,
            "{key} refused"
        );
        // Housekeeping (moka applies its admission and eviction here).
        let _ = store.len();
        assert_eq!(
            store.put_if_absent(&key, b"second", TTL).await.unwrap(),
            Some(bytes::Bytes::from_static(b"first")),
            "the duplicate of {key} got through"
        );
    }
}

/// Capacity is in bytes: ten values of 1 MiB do not fit in 4 MiB.
#[tokio::test]
async fn capacity_counts_bytes() {
    let store = MemoryStore::new(4 << 20);
    let big = vec![7u8; 1 << 20];
    for i in 0..10 {
        store
            .put_if_absent(&format!("big-{i}"), &big, TTL)
            .await
            .unwrap();
    }
    let len = store.len();
    assert!((1..=4).contains(&len), "{len} entries of 1 MiB in 4 MiB");
    // The newest is the one kept.
    assert!(
        store
            .put_if_absent("big-9", b"x", TTL)
            .await
            .unwrap()
            .is_some()
    );
}

/// Every live entry pushed out for room is counted; entries that expired
/// are not evictions.
#[tokio::test]
async fn evictions_of_live_keys_are_counted() {
    let store = MemoryStore::new(4 * 1024);
    for i in 0..50 {
        store
            .put_if_absent(&format!("short-{i}"), b"v", Duration::from_millis(1))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let _ = store.len();
    assert_eq!(store.evictions(), 0);
    flood(&store, 1_000).await;
    let live = store.len();
    assert!(live > 0 && live < 1_000, "{live} live");
    assert_eq!(store.evictions() + live, 1_000);
}

/// Forbids the calling thread to sleep: from here on its `nanosleep` and
/// `clock_nanosleep` fail (`EPERM`), and `std::thread::sleep` panics.
#[cfg(target_os = "linux")]
fn forbid_sleeping() {
    use seccompiler::{BpfProgram, SeccompAction, SeccompFilter};
    let rules = [libc::SYS_nanosleep, libc::SYS_clock_nanosleep]
        .into_iter()
        .map(|call| (call, vec![]))
        .collect();
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM.unsigned_abs()),
        std::env::consts::ARCH.try_into().unwrap(),
    )
    .unwrap();
    let program: BpfProgram = filter.try_into().unwrap();
    seccompiler::apply_filter(&program).unwrap();
}

/// The store is called on an async runtime's worker thread: a call that
/// slept there would stall every other task of that worker. Two threads
/// write fresh keys, expiring at once (the churn that makes a store
/// housekeep), as fast as they can, each on a runtime of its own and
/// forbidden to sleep: every call returns. (The store on moka's cache
/// slept its caller's thread 50 µs whenever moka's write log was full,
/// which two writers filled within a few thousand writes: this test
/// panicked there.)
#[cfg(target_os = "linux")]
#[test]
fn two_threads_writing_at_once_never_sleep_in_a_call() {
    const WRITES: u64 = 200_000;
    let store = MemoryStore::default();
    let writers: Vec<_> = (0..2)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                forbid_sleeping();
                rt.block_on(async {
                    for i in 0..WRITES {
                        let key = format!("churn-{t}-{i}");
                        store
                            .put_if_absent(&key, b"v", Duration::from_millis(1))
                            .await
                            .unwrap();
                    }
                });
            })
        })
        .collect();
    for w in writers {
        assert!(w.join().is_ok(), "a call slept its thread");
    }
    // What was written expired, and went.
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(store.len(), 0);
    assert_eq!(store.weighted_size(), 0);
}

/// Against a plain map (no expiry, no eviction): every answer, every
/// value left and the bytes counted agree, whatever the order of the
/// operations on a handful of keys and values.
mod model {
    use super::*;
    use norepeat::store::ReadStoreExt;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// What the docs say an entry costs beyond its key and value.
    const ENTRY_OVERHEAD: usize = 128;

    #[derive(Debug, Clone)]
    enum Step {
        Put(u8, u8),
        Delete(u8, u8),
        Expire(u8, u8),
        Replace(u8, u8, u8),
        Get(u8),
    }

    fn step() -> impl Strategy<Value = Step> {
        let k = 0..6u8;
        let v = 0..3u8;
        prop_oneof![
            (k.clone(), v.clone()).prop_map(|(k, v)| Step::Put(k, v)),
            (k.clone(), v.clone()).prop_map(|(k, v)| Step::Delete(k, v)),
            (k.clone(), v.clone()).prop_map(|(k, v)| Step::Expire(k, v)),
            (k.clone(), v.clone(), v).prop_map(|(k, a, b)| Step::Replace(k, a, b)),
            k.prop_map(Step::Get),
        ]
    }

    /// Values of different lengths, so the bytes counted tell them
    /// apart.
    fn value(v: u8) -> Vec<u8> {
        vec![b'a' + v; usize::from(v) + 1]
    }

    proptest! {
        #[test]
        fn the_store_agrees_with_a_map(steps in proptest::collection::vec(step(), 1..60)) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let s = MemoryStore::default();
            let ttl = Duration::from_secs(600);
            let mut map: HashMap<String, Vec<u8>> = HashMap::new();
            for st in steps {
                match st {
                    Step::Put(k, v) => {
                        let key = format!("k{k}");
                        let got = rt.block_on(s.put_if_absent(&key, &value(v), ttl)).unwrap();
                        prop_assert_eq!(got.map(|b| b.to_vec()), map.get(&key).cloned());
                        map.entry(key).or_insert_with(|| value(v));
                    }
                    Step::Delete(k, v) => {
                        let key = format!("k{k}");
                        let got = rt.block_on(s.delete_if_equals(&key, &value(v))).unwrap();
                        let held = map.get(&key) == Some(&value(v));
                        prop_assert_eq!(got, held);
                        if held {
                            map.remove(&key);
                        }
                    }
                    Step::Expire(k, v) => {
                        let key = format!("k{k}");
                        let got = rt.block_on(s.expire_if_equals(&key, &value(v), ttl)).unwrap();
                        prop_assert_eq!(got, map.get(&key) == Some(&value(v)));
                    }
                    Step::Replace(k, a, b) => {
                        let key = format!("k{k}");
                        let got = rt
                            .block_on(s.replace_if_equals(&key, &value(a), &value(b), ttl))
                            .unwrap();
                        let held = map.get(&key) == Some(&value(a));
                        prop_assert_eq!(got, held);
                        if held {
                            map.insert(key, value(b));
                        }
                    }
                    Step::Get(k) => {
                        let key = format!("k{k}");
                        let got = rt.block_on(s.get(&key)).unwrap();
                        prop_assert_eq!(got.map(|b| b.to_vec()), map.get(&key).cloned());
                    }
                }
                let bytes: u64 = map
                    .iter()
                    .map(|(k, v)| (k.len() + v.len() + ENTRY_OVERHEAD) as u64)
                    .sum();
                prop_assert_eq!(s.weighted_size(), bytes);
                prop_assert_eq!(s.len(), map.len() as u64);
            }
            prop_assert_eq!(s.evictions(), 0);
        }
    }
}
