//! One-time tokens across instances whose clocks differ, on a real Redis:
//! the used-marker outlives the token on every instance, so no two
//! instances both accept one token.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used)]

use norepeat::store::RedisStore;
use norepeat::token::{TokenGuard, TokenGuardError, TokenSigner};
use norepeat_testkit::RedisServer;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// An instance: a guard on its own connection whose clock reads `now`
/// plus `offset_ms` (negative: behind).
async fn instance(
    redis: &RedisServer,
    now: &Arc<AtomicU64>,
    offset_ms: i64,
) -> TokenGuard<RedisStore> {
    let now = Arc::clone(now);
    let clock = move || now.load(Ordering::SeqCst).saturating_add_signed(offset_ms);
    let signer = TokenSigner::new([9; 32]).with_clock(clock);
    TokenGuard::new(RedisStore::connect(&redis.url()).await.unwrap(), signer)
}

/// The milliseconds left on every key in `redis`.
async fn pttls(redis: &RedisServer) -> Vec<i64> {
    let keys = redis.keys_with_pttl().await;
    keys.into_iter().map(|(_, pttl)| pttl).collect()
}

#[tokio::test]
async fn instances_30s_apart_accept_a_token_once() {
    let redis = RedisServer::start().await;
    let start = 1_800_000_000_000;
    let now = Arc::new(AtomicU64::new(start));
    let right = instance(&redis, &now, 0).await;
    let behind = instance(&redis, &now, -30_000).await;

    let t = right.issue("u1"); // good until start + 60 s by `right`'s clock
    // `right` takes it 50 ms before it expires there; `behind` still has
    // 30 s of it.
    now.store(start + 60_000 - 50, Ordering::SeqCst);
    right.consume("u1", &t.token).await.unwrap();
    // Redis counts the marker's life on its own, real clock: give a marker
    // living "expiry minus this clock" (50 ms) time to go.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let again = behind.consume("u1", &t.token).await;
    assert!(matches!(again, Err(TokenGuardError::Used)), "{again:?}");

    // The marker lives the token's life (60 s) plus the 60 s allowance.
    let left = pttls(&redis).await;
    assert_eq!(left.len(), 1);
    assert!(left[0] > 60_000 && left[0] <= 120_000, "{left:?}");
}

#[tokio::test]
async fn the_skew_allowance_is_configurable() {
    let redis = RedisServer::start().await;
    let now = Arc::new(AtomicU64::new(1_800_000_000_000));
    let guard = instance(&redis, &now, 0)
        .await
        .clock_skew(Duration::from_secs(5));
    let t = guard.issue("u1");
    guard.consume("u1", &t.token).await.unwrap();
    let left = pttls(&redis).await;
    assert_eq!(left.len(), 1);
    assert!(left[0] > 60_000 && left[0] <= 65_000, "{left:?}");
}
