//! `?replicas=N` on a Redis URL: a claim or a completion waits for `N`
//! replicas (`WAIT`), and one they did not acknowledge in time is a store
//! failure, though it ran on the master. Real `redis-server`s from the test
//! kit: a master alone, and a master with a replica linked by `REPLICAOF`.
//! The failover itself is in `sentinel.rs`.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used)]

use crate::common::{eventually, node};
use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use norepeat::attribute::{Guarded, Rejected};
use norepeat::degrade::FailurePolicy;
use norepeat::fingerprint::{Digest, FingerprintGuard, FingerprintGuardError};
use norepeat::idempotency::IdempotencyLayer;
use norepeat::store::{
    AnyStore, KeyValueStoreExt, RateStoreExt, ReadStoreExt, RedisStore, StoreError,
};
use norepeat::token::{TokenGuard, TokenGuardError, TokenSigner};
use norepeat_testkit::{RedisServer, send};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
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

/// Makes `replica` a replica of `master`, and waits for the link.
async fn link(replica: &RedisServer, master: &RedisServer) {
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master.port())
        .query_async(&mut node(replica.port()).await)
        .await
        .unwrap();
    eventually("the replica's link to come up", || async {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut node(replica.port()).await)
            .await
            .ok()?;
        info.contains("master_link_status:up").then_some(())
    })
    .await;
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
    link(&replica, &master).await;
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

/// Every guard, fail-closed, on a master whose replica is gone
/// (`replicas=1`, none acknowledges): the claim is written on the master,
/// the guard is told the store failed and refuses its request, which runs
/// nothing. Each takes its claim back (owner-checked), so once a replica is
/// back, the retries run, each once: the idempotency key's payment, the
/// fingerprint, the token and the `once` call. Before: the claims stayed,
/// and each retry was refused as a repeat of a request that never ran
/// (409 for the fingerprint's window, the token spent, the idempotency
/// key in progress and then an unknown outcome).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_guard_refused_for_a_short_wait_takes_its_claim_back() {
    let master = RedisServer::start().await;
    let url = format!("{}?replicas=1&replicas_timeout=200ms", master.url());
    let store = RedisStore::connect(&url).await.unwrap();
    let closed = FailurePolicy::FailClosed;

    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let app = Router::new().route(
        "/payments",
        post(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async { StatusCode::CREATED }
        })
        .layer(IdempotencyLayer::new(store.clone()).on_store_failure(closed)),
    );
    let payment = || {
        Request::post("/payments")
            .header("x-user-id", "u1")
            .header("idempotency-key", "k-short")
            .body(Body::empty())
            .unwrap()
    };
    let fingerprints = FingerprintGuard::new(store.clone())
        .window(Duration::from_secs(60))
        .on_store_failure(closed);
    let fp = Digest([7; 32]);
    let tokens = TokenGuard::new(store.clone(), TokenSigner::new([9; 32])).on_store_failure(closed);
    let token = tokens.issue("u1").token;
    let once = Guarded::once("tests::short_wait").on_store_failure(closed);
    let once_runs = Arc::new(AtomicUsize::new(0));
    let call_once = || {
        let once_runs = Arc::clone(&once_runs);
        once.run_once(&store, "order-1", async move {
            Ok::<_, Rejected>(once_runs.fetch_add(1, Ordering::SeqCst) + 1)
        })
    };

    let refused = send(&app, payment()).await;
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{:?}",
        refused.body
    );
    assert!(matches!(
        fingerprints.acquire(&fp).await,
        Err(FingerprintGuardError::Unavailable(
            StoreError::NotReplicated(_)
        ))
    ));
    assert!(matches!(
        tokens.consume("u1", &token).await,
        Err(TokenGuardError::Unavailable(StoreError::NotReplicated(_)))
    ));
    assert!(matches!(call_once().await, Err(Rejected::Unavailable(_))));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(once_runs.load(Ordering::SeqCst), 0);
    // Each claim was written on the master, and each is taken back.
    eventually("the four claims to be taken back", || async {
        master.keys_with_pttl().await.is_empty().then_some(())
    })
    .await;

    let replica = RedisServer::start().await;
    link(&replica, &master).await;
    // Until the replica's acknowledgements come in time (the first may be
    // late on a busy machine), a retry is refused again and its claim taken
    // back again, having run nothing; the retries then go through, once.
    eventually("the payment's retry to run", || async {
        (send(&app, payment()).await.status == StatusCode::CREATED).then_some(())
    })
    .await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let again = send(&app, payment()).await;
    assert_eq!(again.headers["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "run once");
    eventually("the fingerprint's retry to be admitted", || async {
        fingerprints.acquire(&fp).await.ok()
    })
    .await;
    eventually("the token's retry to be accepted", || async {
        tokens.consume("u1", &token).await.ok()
    })
    .await;
    let ran = eventually("the once call's retry to run", || async {
        call_once().await.ok()
    })
    .await;
    assert_eq!(ran, 1);
    assert_eq!(once_runs.load(Ordering::SeqCst), 1);
}

/// `calls=` of `cmdstat_<name>` in the server's `INFO commandstats`.
async fn calls(port: u16, name: &str) -> u64 {
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut node(port).await)
        .await
        .unwrap();
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:calls=")))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// Claims that come while a batch waits for its `WAIT` wait with it, and
/// leave together under the next one. The replica is stopped (SIGSTOP), so
/// a first claim's `WAIT` blocks its connection; ten claims then come one
/// after another, 20 ms apart; the replica goes on (SIGCONT) and every
/// claim is answered, under at most four `WAIT`s (the first, and one
/// more per connection: the store has two). Before: each claim left at
/// once, in a batch of its own behind the blocked `WAIT`, with a `WAIT`
/// of its own: 11 for 11 claims. Under load that was 1.2 claims per
/// `WAIT`, and a sixth of the claims per second of `replicas=0` (the
/// bench's `fingerprint.acquire.replicas1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_that_come_during_a_wait_share_the_next_one() {
    let master = RedisServer::start().await;
    let replica = RedisServer::start().await;
    link(&replica, &master).await;
    let url = format!("{}?replicas=1&replicas_timeout=1s", master.url());
    let store = RedisStore::connect(&url).await.unwrap();
    // Both connections made before the count starts.
    assert_eq!(
        store.put_if_absent("warm:1", b"a", TTL).await.unwrap(),
        None
    );
    assert_eq!(
        store.put_if_absent("warm:2", b"a", TTL).await.unwrap(),
        None
    );
    let mut admin = node(master.port()).await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut admin)
        .await
        .unwrap();
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut node(replica.port()).await)
        .await
        .unwrap();
    let pid = info
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .unwrap()
        .trim()
        .to_owned();
    let signal = |sig: &str| {
        let status = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap();
        assert!(status.success(), "kill {sig} {pid}");
    };
    signal("-STOP");
    let claim = |key: String| {
        let store = store.clone();
        tokio::spawn(async move { store.put_if_absent(&key, b"a", TTL).await })
    };
    let mut claims = vec![claim("first".to_owned())];
    tokio::time::sleep(Duration::from_millis(100)).await;
    for i in 0..10 {
        claims.push(claim(format!("later:{i}")));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    signal("-CONT");
    for answer in futures_util::future::join_all(claims).await {
        assert_eq!(answer.unwrap().unwrap(), None);
    }
    let (sets, waits) = (
        calls(master.port(), "set").await,
        calls(master.port(), "wait").await,
    );
    assert_eq!(sets, 11);
    assert!(waits <= 4, "{sets} claims under {waits} WAITs");
}
