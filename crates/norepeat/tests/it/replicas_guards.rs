//! The guards over a Redis URL with `?replicas=1` whose replica is gone or
//! stalled: what a claim written on the master but not acknowledged does
//! to a request and to its retry, and how claims share `WAIT`s. Real
//! `redis-server`s from the test kit; a replica stalled with `SIGSTOP`.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used)]

use crate::common::{counting_route, eventually, node};
use axum::body::Body;
use http::{Request, StatusCode};
use norepeat::attribute::{Guarded, Rejected};
use norepeat::degrade::FailurePolicy;
use norepeat::fingerprint::{Digest, FingerprintGuard, FingerprintGuardError};
use norepeat::idempotency::{Abandoned, Attempt, IdempotencyLayer};
use norepeat::store::{KeyValueStoreExt, RedisStore, StoreError};
use norepeat::token::{TokenGuard, TokenGuardError, TokenSigner};
use norepeat_testkit::{RedisServer, send};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const TTL: Duration = Duration::from_secs(30);

/// `POST /orders` as user `u1` with `Idempotency-Key: key`.
fn keyed(key: &str) -> Request<Body> {
    Request::post("/orders")
        .header("x-user-id", "u1")
        .header("idempotency-key", key)
        .body(Body::empty())
        .unwrap()
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
    let app = counting_route(
        IdempotencyLayer::new(store.clone()).on_store_failure(closed),
        Arc::clone(&runs),
    );
    let payment = || keyed("k-short");
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
    replica.replicate(&master).await;
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
    replica.replicate(&master).await;
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
    replica.pause();
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
    replica.resume();
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

/// A retry that takes over a released key (its first try answered 500)
/// while the replica is stalled: the take-over is written on the master,
/// not acknowledged, and the request refused (503) without running. The
/// released record is put back in its place, so once the replica goes on,
/// the next retry takes the key over and runs, once, and its answer is
/// replayed, as the record's second attempt. Before: the refused take-over
/// stayed as a claim in progress,
/// and every retry got 409 while its lease lasted, then an unknown outcome
/// for a request that never ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_over_refused_for_a_short_wait_puts_the_released_record_back() {
    let master = RedisServer::start().await;
    let replica = RedisServer::start().await;
    replica.replicate(&master).await;
    let url = format!("{}?replicas=1&replicas_timeout=200ms", master.url());
    let store = RedisStore::connect(&url).await.unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let attempts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&attempts);
    // The first run fails (500: released, nothing kept); the others create.
    // Each notes the attempt the layer says it is.
    let app = axum::Router::new().route(
        "/orders",
        axum::routing::post(move |attempt: axum::Extension<Attempt>| {
            seen.lock().unwrap().push(attempt.0.get());
            let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                if first {
                    StatusCode::INTERNAL_SERVER_ERROR
                } else {
                    StatusCode::CREATED
                }
            }
        })
        .layer(IdempotencyLayer::new(store).abandoned(Abandoned::OutcomeUnknown)),
    );

    let failed = send(&app, keyed("k-take")).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    replica.pause();
    let refused = send(&app, keyed("k-take")).await;
    replica.resume();
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{:?}",
        refused.body
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the refused retry ran");

    eventually("the next retry to run", || async {
        let answer = send(&app, keyed("k-take")).await;
        (answer.status == StatusCode::CREATED).then_some(())
    })
    .await;
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let again = send(&app, keyed("k-take")).await;
    assert_eq!(again.headers["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "run once more, not twice");
    // The released record's history was kept: the run after it is its
    // second attempt (a deleted key would have made it a first again, and
    // the handler could not tell that the backend may have seen one).
    assert_eq!(*attempts.lock().unwrap(), [1, 2]);
}
