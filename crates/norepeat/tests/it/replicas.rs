//! `?replicas=N` on a Redis URL: a claim or a completion waits for `N`
//! replicas (`WAIT`), and one they did not acknowledge in time is a store
//! failure, though it ran on the master. Real `redis-server`s from the test
//! kit: a master alone, and a master with a replica linked by `REPLICAOF`.
//! The guards over such a store are in `replicas_guards.rs`, the failover
//! itself in `sentinel.rs`.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used)]

use crate::common::node;
use norepeat::store::{
    AnyStore, KeyValueStoreExt, RateStoreExt, ReadStoreExt, RedisStore, StoreError,
};
use norepeat_testkit::RedisServer;
use std::time::Duration;

const TTL: Duration = Duration::from_secs(30);

/// Whether the server at `port` holds `key`.
async fn holds(port: u16, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(&mut node(port).await)
        .await
        .unwrap()
        == 1
}

/// A master with no replica: a claim runs there, but no replica
/// acknowledges it, so its caller is told the store failed (the route's
/// policy decides), naming the shortfall. A completion likewise. Reads,
/// releases, renewals and rate limits do not wait. Before `replicas`: the
/// claim succeeded, and a failover could lose it.
#[tokio::test]
async fn a_claim_no_replica_acknowledged_is_a_store_failure() {
    let redis = RedisServer::start().await;
    let url = format!("{}?replicas=1&replicas_timeout=20ms", redis.url());
    let store = RedisStore::connect(&url).await.unwrap();
    let e = store.put_if_absent("claim", b"a", TTL).await.unwrap_err();
    let StoreError::NotReplicated(why) = &e else {
        panic!("a store failure, not {e:?}")
    };
    assert!(
        why.contains("replicas") && why.contains("0 had it"),
        "{why}"
    );
    assert!(
        holds(redis.port(), "claim").await,
        "the claim ran on the master"
    );

    let e = store
        .replace_if_equals("claim", b"a", b"done", TTL)
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::NotReplicated(_)), "{e:?}");
    assert_eq!(
        store.get("claim").await.unwrap().as_deref(),
        Some(&b"done"[..])
    );
    assert!(store.expire_if_equals("claim", b"done", TTL).await.unwrap());
    assert!(store.delete_if_equals("claim", b"done").await.unwrap());
    assert!(store.fixed_window("rl", 5, TTL).await.unwrap().allowed);

    // Through AnyStore (the shop's REDIS_URL, the gateway's store:) alike.
    let any = AnyStore::from_url(Some(&url)).await.unwrap();
    assert!(any.put_if_absent("any", b"a", TTL).await.is_err());
    // replicas=0 is no wait at all.
    let none = RedisStore::connect(&format!("{}?replicas=0", redis.url()))
        .await
        .unwrap();
    assert_eq!(none.put_if_absent("zero", b"a", TTL).await.unwrap(), None);
}

/// A master with a linked replica: a claim with `replicas=1` succeeds,
/// and the replica has it by the time the claim is answered (`WAIT` came
/// back with 1). Many claims at once share one `WAIT` per batch, each
/// answered.
#[tokio::test]
async fn a_claim_a_replica_acknowledged_is_on_the_replica_when_answered() {
    let master = RedisServer::start().await;
    let replica = RedisServer::start().await;
    replica.replicate(&master).await;
    let store = RedisStore::connect(&format!("{}?replicas=1&replicas_timeout=1s", master.url()))
        .await
        .unwrap();
    assert_eq!(store.put_if_absent("one", b"a", TTL).await.unwrap(), None);
    assert!(
        holds(replica.port(), "one").await,
        "acknowledged: on the replica"
    );
    assert!(
        store
            .replace_if_equals("one", b"a", b"done", TTL)
            .await
            .unwrap()
    );

    let claims = (0..64).map(|i| {
        let store = store.clone();
        async move { store.put_if_absent(&format!("many:{i}"), b"a", TTL).await }
    });
    for answer in futures_util::future::join_all(claims).await {
        assert_eq!(answer.unwrap(), None);
    }
    for i in 0..64 {
        assert!(
            holds(replica.port(), &format!("many:{i}")).await,
            "many:{i}"
        );
    }
}

/// A query parameter the store does not know is an error naming it (a
/// misspelt `replica=1` must not leave a store running without the wait
/// its user asked for); nothing is sent. Before: redis-rs ignored it.
#[tokio::test]
async fn an_unknown_query_parameter_is_an_invalid_url() {
    for url in [
        "redis://127.0.0.1:1?replica=1",
        "redis://127.0.0.1:1?replicas=1&replicas_timeout=0ms",
        "redis+cluster://127.0.0.1:1,127.0.0.1:2?replica=1",
        "redis+sentinel://127.0.0.1:1/mymaster?replica=1",
        "redis+sentinel://127.0.0.1:1",
    ] {
        let e = AnyStore::from_url(Some(url)).await.unwrap_err();
        assert!(matches!(e, StoreError::InvalidUrl(_)), "{url}: {e:?}");
        if url.contains("replica=") {
            assert!(e.to_string().contains("\"replica\""), "{url}: {e}");
        }
    }
    assert!(matches!(
        RedisStore::connect_lazy("redis+sentinel://127.0.0.1:1/mymaster"),
        Err(StoreError::InvalidUrl(_))
    ));
}

/// On a Redis Cluster the choice is the same: each claim waits for its
/// master's replicas (the test kit's masters have one each), in the batch
/// that master gets; asking for more than there are fails every claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_claim_waits_for_its_masters_replica() {
    let cluster = norepeat_testkit::RedisCluster::start().await;
    let one = AnyStore::from_url(Some(&format!(
        "{}?replicas=1&replicas_timeout=1s",
        cluster.url()
    )))
    .await
    .unwrap();
    let claims = (0..32).map(|i| {
        let one = one.clone();
        async move { one.put_if_absent(&format!("c:{i}"), b"a", TTL).await }
    });
    for answer in futures_util::future::join_all(claims).await {
        assert_eq!(answer.unwrap(), None);
    }
    let two = AnyStore::from_url(Some(&format!(
        "{}?replicas=2&replicas_timeout=20ms",
        cluster.url()
    )))
    .await
    .unwrap();
    let e = two.put_if_absent("c:two", b"a", TTL).await.unwrap_err();
    assert!(e.to_string().contains("1 had it"), "{e}");
}

/// A claim that found its key held wrote nothing: it is a repeat, whatever
/// `WAIT` answered after it (no replica here), and an owner-checked
/// replacement of a value the key does not hold is a plain `false`.
/// Before: both were store failures, so a repeat on a fail-open route ran
/// unguarded and a fail-closed one answered 503 instead of 409.
#[tokio::test]
async fn a_claim_that_found_the_key_held_is_a_repeat_whatever_wait_said() {
    let redis = RedisServer::start().await;
    let plain = RedisStore::connect(&redis.url()).await.unwrap();
    assert_eq!(
        plain.put_if_absent("held", b"first", TTL).await.unwrap(),
        None
    );
    let url = format!("{}?replicas=1&replicas_timeout=20ms", redis.url());
    let store = RedisStore::connect(&url).await.unwrap();
    assert_eq!(
        store
            .put_if_absent("held", b"second", TTL)
            .await
            .unwrap()
            .as_deref(),
        Some(&b"first"[..])
    );
    assert!(
        !store
            .replace_if_equals("held", b"other", b"done", TTL)
            .await
            .unwrap()
    );
}
