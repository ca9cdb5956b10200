//! The attribute's key is an injective function of its arguments: two
//! argument tuples that format to the same text once joined by the
//! template's separators still get different keys.

// Helpers outside `#[test]` functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used)]

use norepeat::attribute::Rejected;
use norepeat::store::MemoryStore;
use std::sync::atomic::{AtomicU32, Ordering};

#[derive(Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Delivery {
    user: String,
    id: String,
}

#[derive(Debug, PartialEq, Eq)]
struct Refused;

impl From<Rejected> for Refused {
    fn from(_: Rejected) -> Self {
        Refused
    }
}

#[norepeat::guard(store = store, key = "{user}/{id}", mode = once, scope = "tests::deliver")]
async fn deliver(
    store: &MemoryStore,
    user: &str,
    id: &str,
    runs: &AtomicU32,
) -> Result<Delivery, Refused> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(Delivery {
        user: user.to_owned(),
        id: id.to_owned(),
    })
}

#[norepeat::guard(store = store, key = "{a}{b}", window = "10s")]
async fn adjacent(store: &MemoryStore, a: &str, b: &str, runs: &AtomicU32) -> Result<(), Refused> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// User `a/b` with id `c` and user `a` with id `b/c`: two deliveries, each
/// answered with its own result.
#[tokio::test]
async fn a_separator_inside_an_argument_does_not_merge_two_keys() {
    let store = MemoryStore::default();
    let runs = AtomicU32::new(0);
    let first = deliver(&store, "a/b", "c", &runs).await.unwrap();
    let second = deliver(&store, "a", "b/c", &runs).await.unwrap();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the second delivery did not run"
    );
    assert_eq!((first.user.as_str(), first.id.as_str()), ("a/b", "c"));
    assert_eq!((second.user.as_str(), second.id.as_str()), ("a", "b/c"));
    // A true repeat is still caught, and answered with its own result.
    assert_eq!(deliver(&store, "a", "b/c", &runs).await.unwrap(), second);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Without any separator: `ab` + `c` and `a` + `bc`.
#[tokio::test]
async fn adjacent_arguments_do_not_merge_either() {
    let store = MemoryStore::default();
    let runs = AtomicU32::new(0);
    adjacent(&store, "ab", "c", &runs).await.unwrap();
    adjacent(&store, "a", "bc", &runs).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(adjacent(&store, "a", "bc", &runs).await, Err(Refused));
}
