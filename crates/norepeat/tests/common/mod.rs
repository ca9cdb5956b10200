//! Helpers the integration tests share (tower-sessions' `tests/common`):
//! each test file that needs one says `mod common;`. The HTTP helper
//! (`send`, `Answer`) is the test kit's, so the shop's tests use it too.

// Each test file is its own crate and uses only some of these helpers.
#![allow(dead_code)]

use norepeat::store::{AnyStore, MemoryStore};
use std::future::Future;

/// Runs `test` against a fresh memory store, then (with the `redis`
/// feature) a fresh Redis, whose keys must all carry a TTL afterwards: a
/// guard never leaves a key behind for good.
pub async fn with_stores<F, Fut>(test: F)
where
    F: Fn(AnyStore) -> Fut,
    Fut: Future<Output = ()>,
{
    test(AnyStore::Memory(MemoryStore::default())).await;
    #[cfg(feature = "redis")]
    {
        let redis = norepeat_testkit::RedisServer::start().await;
        let store = norepeat::store::RedisStore::connect(&redis.url())
            .await
            .unwrap_or_else(|e| panic!("connect {}: {e}", redis.url()));
        test(AnyStore::Redis(store)).await;
        assert_eq!(redis.keys_without_ttl().await, Vec::<String>::new());
    }
}
