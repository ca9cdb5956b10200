// Over 400 lines: every guard on one Redis Cluster and its failover, sharing one cluster set-up that costs seconds to start.
//! Every guard on a real Redis Cluster from the test kit (3 masters, 3
//! replicas): tokens, fingerprints, `Idempotency-Key` replay and the three
//! rate-limit algorithms behave as on one Redis; keys spread over every
//! master and all expire; and a master's failover costs no 5xx and no lost
//! scripts.
//!
//! Each test starts its own cluster (nextest runs them one at a time). Timing
//! assertions are loose: the machine is shared.
//!
//! Over 400 lines: every capability against the same cluster helpers at the
//! top (connect, key slots, storms).
#![cfg(feature = "redis")]
// Test helpers outside #[test] functions unwrap too: a failure there is a failed test.
#![allow(clippy::unwrap_used)]

use crate::common::{counting_route, node};
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use futures_util::future::join_all;
use norepeat::fingerprint::{Digest, Fingerprinter, RequestParts};
use norepeat::fingerprint::{FingerprintGuard, FingerprintLayer, ReleasePolicy};
use norepeat::idempotency::IdempotencyLayer;
use norepeat::ratelimit::{Algorithm, Quota, RateLimiter};
use norepeat::store::{AnyStore, ClusterStore, MemoryStore, RateDecision, Store};
use norepeat::store::{Fallback, Resilient};
use norepeat::store::{KeyValueStore, KeyValueStoreExt, RateStoreExt};
use norepeat::token::TokenSigner;
use norepeat::token::{TokenGuard, TokenLayer};
use norepeat_testkit::{RedisCluster, post_with_token, send};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tower::ServiceExt;

const ALGORITHMS: [Algorithm; 3] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::Gcra,
];

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

/// A fresh connection to the cluster, as another instance would have.
async fn connect(cluster: &RedisCluster) -> ClusterStore {
    ClusterStore::connect(&cluster.node_urls()).await.unwrap()
}

/// Keys that would never expire (PTTL -1), on any master.
async fn keys_without_ttl(cluster: &RedisCluster) -> Vec<String> {
    cluster
        .keys_with_pttl()
        .await
        .into_iter()
        .filter(|(_, _, pttl)| *pttl == -1)
        .map(|(port, key, _)| format!("{port}:{key}"))
        .collect()
}

/// The slot ranges the master at `port` serves, from `CLUSTER SLOTS`.
async fn slots_of(port: u16) -> Vec<(u16, u16)> {
    let mut con = node(port).await;
    let slots: Vec<redis::Value> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(&mut con)
        .await
        .unwrap();
    let mut out = Vec::new();
    for range in slots {
        let redis::Value::Array(parts) = range else {
            continue;
        };
        let from: u16 = redis::from_redis_value(parts[0].clone()).unwrap();
        let to: u16 = redis::from_redis_value(parts[1].clone()).unwrap();
        let redis::Value::Array(master) = &parts[2] else {
            continue;
        };
        let master_port: u16 = redis::from_redis_value(master[1].clone()).unwrap();
        if master_port == port {
            out.push((from, to));
        }
    }
    out
}

async fn slot_of(port: u16, key: &str) -> u16 {
    let mut con = node(port).await;
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query_async(&mut con)
        .await
        .unwrap()
}

// ---------------------------------------------------------------- guards

fn order(user: &str, body: String) -> Request<Body> {
    Request::post("/orders")
        .header("x-user-id", user)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap()
}

/// `n` copies of one request spread over `apps` (instances); the statuses.
async fn storm(
    apps: &[Router],
    n: usize,
    make: impl Fn(usize) -> Request<Body>,
) -> Vec<StatusCode> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let app = apps[i % apps.len()].clone();
            let req = make(i);
            tokio::spawn(async move { app.oneshot(req).await.unwrap().status() })
        })
        .collect();
    join_all(tasks)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect()
}

fn count(statuses: &[StatusCode], s: StatusCode) -> usize {
    statuses.iter().filter(|x| **x == s).count()
}

/// Tokens and fingerprints on two instances (two cluster connections):
/// one handler run per submission; owner-checked release; keys on all three
/// masters, every one with a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_tokens_and_fingerprints_run_the_handler_once() {
    let cluster = RedisCluster::start().await;
    let any = AnyStore::from_url(Some(&cluster.url())).await.unwrap();
    assert_eq!(any.kind(), "cluster");
    let other = connect(&cluster).await;

    // 1000 identical fingerprints over two instances: one run.
    let runs = Arc::new(AtomicUsize::new(0));
    let window = Duration::from_secs(30);
    let apps = [
        counting_route(
            FingerprintLayer::new(FingerprintGuard::new(any.clone()).window(window)),
            Arc::clone(&runs),
        ),
        counting_route(
            FingerprintLayer::new(FingerprintGuard::new(other.clone()).window(window)),
            Arc::clone(&runs),
        ),
    ];
    let statuses = storm(&apps, 1000, |_| {
        order("u1", r#"{"sku":"SKU-1","quantity":1}"#.to_owned())
    })
    .await;
    assert_eq!(
        (
            count(&statuses, StatusCode::CREATED),
            count(&statuses, StatusCode::CONFLICT)
        ),
        (1, 999)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // 1000 uses of one token over two instances: one run.
    let signer = TokenSigner::random();
    let runs = Arc::new(AtomicUsize::new(0));
    let issuer = TokenGuard::new(any.clone(), signer.clone());
    let token = issuer.issue("u1").token;
    let apps = [
        counting_route(TokenLayer::new(issuer), Arc::clone(&runs)),
        counting_route(
            TokenLayer::new(TokenGuard::new(other.clone(), signer)),
            Arc::clone(&runs),
        ),
    ];
    let statuses = storm(&apps, 1000, |i| {
        post_with_token("/orders", "u1", token.as_str())
            .body(Body::from(format!(r#"{{"quantity":{}}}"#, i % 100)))
            .unwrap()
    })
    .await;
    assert_eq!(count(&statuses, StatusCode::CREATED), 1);
    assert_eq!(count(&statuses, StatusCode::CONFLICT), 999);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // The lost lock: A's late release must not delete B's key (release.lua).
    let guard = FingerprintGuard::new(any.clone())
        .window(Duration::from_millis(150))
        .release(ReleasePolicy::ReleaseOnCompletion);
    // B's window is seconds long (the key does not depend on the window),
    // so only A's release could remove B's key before the checks below,
    // however slow the machine (as in guard.rs).
    let next = FingerprintGuard::new(any.clone())
        .window(Duration::from_secs(2))
        .release(ReleasePolicy::ReleaseOnCompletion);
    let fp = Digest([9; 32]);
    assert_eq!(guard.key_of(&fp), next.key_of(&fp));
    let a = guard.acquire(&fp).await.unwrap();
    let b = crate::common::eventually("A's key expires", || async { next.acquire(&fp).await.ok() })
        .await;
    a.finish(true).await;
    assert!(
        next.acquire(&fp).await.is_err(),
        "A's release deleted B's key"
    );
    assert!(
        b.renew().await.unwrap(),
        "renew.lua extends the owner's key"
    );
    b.finish(false).await;
    assert!(guard.acquire(&fp).await.is_ok(), "released by its owner");

    // 300 fingerprints: on every master, and every key expires.
    let guard = FingerprintGuard::new(any.clone()).window(window);
    for i in 0..300u32 {
        let mut bytes = [0; 32];
        bytes[..4].copy_from_slice(&i.to_be_bytes());
        // Success: the key is held for the window (a dropped lease releases).
        guard
            .acquire(&Digest(bytes))
            .await
            .unwrap()
            .finish(true)
            .await;
    }
    let per_master = cluster.keys_per_master().await;
    assert_eq!(per_master.len(), 3, "{per_master:?}");
    assert!(per_master.iter().all(|(_, n)| *n > 0), "{per_master:?}");
    assert!(per_master.iter().map(|(_, n)| n).sum::<u64>() >= 300);
    assert_eq!(keys_without_ttl(&cluster).await, Vec::<String>::new());
}

// ----------------------------------------------------------- idempotency

type Runs = Arc<AtomicUsize>;

async fn pay(State(runs): State<Runs>, headers: HeaderMap, _body: Bytes) -> Response {
    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
    if let Some(ms) = headers
        .get("x-sleep-ms")
        .and_then(|v| v.to_str().ok()?.parse().ok())
    {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if headers.contains_key("x-hold") {
        // Closed by the one test that sends `x-hold`: the go-ahead.
        let _ = HOLD.acquire().await;
    }
    let body = format!(r#"{{"paymentId":"p{n}","orderId":"o1","amount":1999,"status":"PENDING"}}"#);
    (
        StatusCode::CREATED,
        [
            ("set-cookie", "session=secret".to_owned()),
            ("location", format!("/payments/p{n}")),
            ("content-type", "application/json".to_owned()),
        ],
        body,
    )
        .into_response()
}

fn payments<G: Store + Clone>(layer: IdempotencyLayer<G>, runs: &Runs) -> Router {
    Router::new()
        .route("/payments", post(pay).layer(layer.route("/payments")))
        .with_state(Arc::clone(runs))
}

const BODY: &str = r#"{"orderId":"o1","amount":1999}"#;

/// Where a handler run sent with `x-hold` waits until the test closes it.
static HOLD: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(0);

fn payment(key: &str, body: &str, sleep_ms: u64) -> Request<Body> {
    Request::post("/payments")
        .header("x-user-id", "u1")
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .header("x-sleep-ms", sleep_ms.to_string())
        .body(Body::from(body.to_owned()))
        .unwrap()
}

/// `Idempotency-Key` over two instances: replay byte for byte on the other
/// instance, 422 for another request, concurrent copies run once (409 or,
/// waiting, the replay), a slow handler's claim renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_idempotency_replays_byte_for_byte() {
    let cluster = RedisCluster::start().await;
    let (sa, sb) = (connect(&cluster).await, connect(&cluster).await);
    let runs = Runs::default();
    let a = payments(IdempotencyLayer::new(sa.clone()), &runs);
    let b = payments(IdempotencyLayer::new(sb.clone()), &runs);

    let first = send(&a, payment("k-1", BODY, 0)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    for (app, body) in [(&b, BODY), (&a, r#"{"amount":1999,"orderId":"o1"}"#)] {
        let again = send(app, payment("k-1", body, 0)).await;
        assert_eq!(again.status, StatusCode::CREATED);
        assert!(again.replayed());
        assert_eq!(again.body, first.body, "byte for byte");
        assert_eq!(again.headers["location"], first.headers["location"]);
        assert!(!again.headers.contains_key("set-cookie"));
    }
    let other = send(&b, payment("k-1", r#"{"orderId":"o1","amount":1}"#, 0)).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // 100 concurrent over two instances: one run, 99 × 409 in use.
    let runs = Runs::default();
    let apps = [
        payments(IdempotencyLayer::new(sa.clone()), &runs),
        payments(IdempotencyLayer::new(sb.clone()), &runs),
    ];
    let statuses = storm(&apps, 100, |_| payment("hot", BODY, 800)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        (
            count(&statuses, StatusCode::CREATED),
            count(&statuses, StatusCode::CONFLICT)
        ),
        (1, 99)
    );

    // Waiting for the result: all 100 get the one answer.
    let runs = Runs::default();
    let wait = Duration::from_secs(10);
    let apps = [
        payments(
            IdempotencyLayer::new(sa.clone()).wait_for_result(wait),
            &runs,
        ),
        payments(
            IdempotencyLayer::new(sb.clone()).wait_for_result(wait),
            &runs,
        ),
    ];
    let answers = join_all((0..100).map(|i| {
        let app = apps[i % 2].clone();
        async move { send(&app, payment("hot-wait", BODY, 800)).await }
    }))
    .await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(answers.iter().all(|a| a.status == StatusCode::CREATED));
    assert!(answers.iter().all(|a| a.body == answers[0].body));
    assert_eq!(answers.iter().filter(|a| a.replayed()).count(), 99);

    // A slow handler keeps its claim through renewals (renew.lua, replace.lua).
    let runs = Runs::default();
    let app = payments(
        IdempotencyLayer::new(sa.clone()).lease(Duration::from_millis(300)),
        &runs,
    );
    let slow = {
        let app = app.clone();
        let mut held = payment("slow", BODY, 0);
        held.headers_mut()
            .insert("x-hold", http::HeaderValue::from_static("1"));
        tokio::spawn(async move { send(&app, held).await })
    };
    // Past two leases since the handler started (polled: it has claimed),
    // still held: renewed. (The handler runs until the test lets it go.)
    crate::common::eventually("the slow handler runs", || async {
        (runs.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let held = send(&b, payment("slow", BODY, 0)).await;
    assert_eq!(held.status, StatusCode::CONFLICT);
    assert_eq!(
        held.json()["code"],
        "idempotency_key_in_use",
        "the renewals moved the deadline in the record"
    );
    HOLD.close();
    let first = slow.await.unwrap();
    let replay = send(&b, payment("slow", BODY, 0)).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // A claim whose lease passes unrenewed (as when its instance dies) is
    // an unknown outcome on the other instance, and is not forgotten: 409
    // `idempotency_outcome_unknown`, until its owner, only slow here,
    // completes it.
    let runs = Runs::default();
    let app = payments(
        IdempotencyLayer::new(sa.clone())
            .lease(Duration::from_millis(300))
            .lease_renewal(false),
        &runs,
    );
    let slow = {
        let app = app.clone();
        tokio::spawn(async move { send(&app, payment("abandoned", BODY, 1_500)).await })
    };
    crate::common::eventually("the unrenewed handler runs", || async {
        (runs.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let unknown = send(&b, payment("abandoned", BODY, 0)).await;
    assert_eq!(unknown.status, StatusCode::CONFLICT);
    assert_eq!(unknown.json()["code"], "idempotency_outcome_unknown");
    let first = slow.await.unwrap();
    let replay = send(&b, payment("abandoned", BODY, 0)).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    assert_eq!(keys_without_ttl(&cluster).await, Vec::<String>::new());
}

// ------------------------------------------------------------ rate limits

/// Two limiters on two connections share one quota exactly, for each
/// algorithm; the scripts agree with the memory store; every key expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_rate_limits_share_one_quota_exactly() {
    let cluster = RedisCluster::start().await;
    let (sa, sb) = (connect(&cluster).await, connect(&cluster).await);
    for algorithm in ALGORITHMS {
        let limiter = |store: ClusterStore| {
            RateLimiter::new(store, Quota::per_minute(nz(10)))
                .name("shared")
                .algorithm(algorithm)
        };
        let (a, b) = (limiter(sa.clone()), limiter(sb.clone()));
        let attempts = (0..40).map(|i| {
            let l = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move { l.check("u1").await.unwrap().allowed })
        });
        let admitted = join_all(attempts)
            .await
            .into_iter()
            .filter(|r| *r.as_ref().unwrap())
            .count();
        assert_eq!(admitted, 10, "{algorithm:?}");
        assert!(a.check("u2").await.unwrap().allowed, "{algorithm:?}");
        // Many callers: their keys spread over the masters.
        for i in 0..60 {
            assert!(b.check(&format!("c{i}")).await.unwrap().allowed);
        }
    }

    // The Lua scripts on the cluster and the memory versions agree.
    for algorithm in ALGORITHMS {
        let run = |store: AnyStore| async move {
            let l = RateLimiter::new(store, Quota::per_minute(nz(3)))
                .name("agree")
                .algorithm(algorithm);
            let mut out: Vec<RateDecision> = Vec::new();
            for _ in 0..5 {
                out.push(l.check("u").await.unwrap());
            }
            out.iter()
                .map(|d| (d.allowed, d.remaining))
                .collect::<Vec<_>>()
        };
        let on_cluster = run(AnyStore::Cluster(sa.clone())).await;
        let in_memory = run(AnyStore::Memory(MemoryStore::new(100))).await;
        assert_eq!(on_cluster, in_memory, "{algorithm:?}");
        assert_eq!(
            on_cluster,
            [(true, 2), (true, 1), (true, 0), (false, 0), (false, 0)],
            "{algorithm:?}"
        );
    }

    let keys = cluster.keys_with_pttl().await;
    assert_eq!(keys.len(), 3 * (2 + 60) + 3, "{keys:?}");
    for (port, key, pttl) in &keys {
        assert!(
            *pttl > 0 && *pttl <= 120_000,
            "{port}:{key} has PTTL {pttl}"
        );
    }
    let per_master = cluster.keys_per_master().await;
    assert!(per_master.iter().all(|(_, n)| *n > 0), "{per_master:?}");
}

// --------------------------------------------------------------- failover

/// Sleeps `x-sleep-ms`, answers 200.
async fn handler(headers: HeaderMap) -> StatusCode {
    if let Some(ms) = headers
        .get("x-sleep-ms")
        .and_then(|v| v.to_str().ok()?.parse().ok())
    {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    StatusCode::OK
}

type FailOpen = Fallback<Resilient<ClusterStore>>;

/// The fail-open shape of the fault-survival issue, on the cluster.
fn fail_open(store: ClusterStore) -> FailOpen {
    Fallback::new(
        Resilient::new(store).timeout(Duration::from_millis(250)),
        MemoryStore::new(10_000),
    )
}

fn fingerprint_app(store: FailOpen) -> Router {
    Router::new().route(
        "/orders",
        post(handler).layer(FingerprintLayer::new(
            FingerprintGuard::new(store).window(Duration::from_secs(60)),
        )),
    )
}

fn body_of(n: u64) -> String {
    format!(r#"{{"item":"book","n":{n}}}"#)
}

/// The key the route's guard writes for request `n`.
fn key_of_request(guard: &FingerprintGuard<FailOpen>, n: u64) -> String {
    let body = body_of(n);
    let fp = Fingerprinter::default()
        .fingerprint(&RequestParts {
            user: "u1",
            method: "POST",
            route: "/orders",
            query: None,
            json: true,
            body: body.as_bytes(),
        })
        .unwrap();
    guard.key_of(&fp)
}

/// A master is killed while a fail-open fingerprint route is driven
/// continuously: no request gets a 5xx; within 20 s of the kill a repeat of a
/// fresh fingerprint (in the killed master's slots) sent to *another*
/// instance is caught, so the promoted replica, not a local fallback, decides.
/// Scripts are flushed from every node first, so the promoted master answers
/// NOSCRIPT and the client loads them again; release and renew still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_master_failover_costs_no_5xx_and_repeats_are_caught_again() {
    let mut cluster = RedisCluster::start().await;
    let (sa, sb) = (connect(&cluster).await, connect(&cluster).await);
    let (a, b) = (
        fingerprint_app(fail_open(sa.clone())),
        fingerprint_app(fail_open(sb.clone())),
    );
    let probe_guard = FingerprintGuard::new(fail_open(sa.clone()));
    let masters_before = cluster.masters().await;
    let victim = masters_before[0];
    let victim_slots = slots_of(victim).await;
    let survivor = *cluster.node_ports().iter().find(|p| **p != victim).unwrap();
    // Request numbers whose key lives in the victim's slots.
    let mut on_victim = Vec::new();
    let mut n = 1_000_000;
    while on_victim.len() < 200 {
        n += 1;
        let slot = slot_of(survivor, &key_of_request(&probe_guard, n)).await;
        if victim_slots.iter().any(|(f, t)| (*f..=*t).contains(&slot)) {
            on_victim.push(n);
        }
    }

    // Healthy: an instance catches the other's repeat.
    let status = |app: &Router, n: u64| {
        let app = app.clone();
        async move { app.oneshot(order("u1", body_of(n))).await.unwrap().status() }
    };
    assert_eq!(status(&a, on_victim[0]).await, StatusCode::OK);
    assert_eq!(status(&b, on_victim[0]).await, StatusCode::CONFLICT);

    // Scripts gone from every node: the promoted replica cannot have them.
    for port in cluster.node_ports() {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut node(port).await)
            .await
            .unwrap();
    }

    // Drive both instances continuously: new fingerprints and repeats.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let driver = {
        let (a, b, stop) = (a.clone(), b.clone(), Arc::clone(&stop));
        tokio::spawn(async move {
            // Per number: its three statuses and when the last one came.
            let mut seen = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                let mut statuses = Vec::new();
                for app in [&a, &b, &a] {
                    let res = app.clone().oneshot(order("u1", body_of(n))).await.unwrap();
                    statuses.push(res.status());
                }
                seen.push((n, statuses, Instant::now()));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            seen
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;

    let killing = Instant::now();
    let killed = cluster.kill_master(0).await;
    assert_eq!(killed, victim);
    let killed_at = Instant::now();
    let mut caught_after = None;
    for &n in &on_victim[1..] {
        if killed_at.elapsed() > Duration::from_secs(25) {
            break;
        }
        let first = status(&a, n).await;
        assert!(first.is_success(), "fresh request {n}: {first}");
        if status(&b, n).await == StatusCode::CONFLICT {
            caught_after = Some(killed_at.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let caught_after = caught_after.expect("no repeat caught by the other instance after the kill");
    eprintln!("repeats caught across instances again {caught_after:?} after the kill");
    assert!(
        caught_after <= Duration::from_secs(20),
        "caught again only after {caught_after:?}"
    );
    cluster.wait_for_failover().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    let seen = driver.await.unwrap();
    let bad: Vec<_> = seen
        .iter()
        .filter(|(_, s, _)| {
            s.iter()
                .any(|s| !s.is_success() && *s != StatusCode::CONFLICT)
        })
        .collect();
    assert!(bad.is_empty(), "answers other than 2xx/409: {bad:?}");
    assert!(seen.len() > 10, "the driver ran: {} numbers", seen.len());
    // Each number went A, B, A. Its first request is always admitted (a
    // fresh fingerprint: the store claims it, or fail-open lets it by).
    for (n, s, _) in &seen {
        assert!(s[0].is_success(), "number {n}, fresh, was refused: {s:?}");
    }
    // While the cluster was healthy (every request of the number answered
    // before the kill began) exactly one was admitted. During the failover
    // this cannot be asserted: fail-open lets a repeat through on each
    // instance's local fallback while its master is unreachable, by design.
    let healthy: Vec<_> = seen.iter().filter(|(_, _, at)| *at < killing).collect();
    assert!(!healthy.is_empty(), "the driver ran before the kill");
    for (n, s, _) in &healthy {
        let admitted = s.iter().filter(|s| s.is_success()).count();
        assert_eq!(admitted, 1, "number {n} before the kill: {s:?}");
    }
    eprintln!(
        "{} numbers during the failover, all 2xx/409; {} before the kill, each admitted once",
        seen.len(),
        healthy.len()
    );

    // The promoted master answered NOSCRIPT; the scripts were loaded again
    // and every script works there (plain store, no fallback).
    let key = key_of_request(&probe_guard, on_victim[on_victim.len() - 1]);
    let ttl = Duration::from_secs(10);
    assert_eq!(sb.put_if_absent(&key, b"v1", ttl).await.unwrap(), None);
    assert!(sb.expire_if_equals(&key, b"v1", ttl * 2).await.unwrap());
    assert!(sb.replace_if_equals(&key, b"v1", b"v2", ttl).await.unwrap());
    assert!(!sb.delete_if_equals(&key, b"v1").await.unwrap());
    assert!(sb.delete_if_equals(&key, b"v2").await.unwrap());
    // The key as a hash tag: the same slot, the promoted master's.
    let rl = format!("{{{key}}}:rl");
    assert!(sb.fixed_window(&rl, 1, ttl).await.unwrap().allowed);
    assert!(!sa.fixed_window(&rl, 1, ttl).await.unwrap().allowed);
    assert!(sa.gcra(&format!("{rl}g"), ttl, 1).await.unwrap().allowed);
    assert!(
        sa.sliding_window(&format!("{rl}s"), 1, ttl)
            .await
            .unwrap()
            .allowed
    );
    let masters_after = cluster.masters().await;
    assert!(!masters_after.contains(&victim));
    let promoted = *masters_after
        .iter()
        .find(|p| !masters_before.contains(p))
        .expect("a replica was promoted");
    // The scripts are on the promoted master now: loaded by the client after
    // its NOSCRIPT (the flush above removed every copy).
    for script in [
        include_str!("../../src/store/redis/lua/release.lua"),
        include_str!("../../src/store/redis/lua/renew.lua"),
        include_str!("../../src/store/redis/lua/replace.lua"),
    ] {
        let exists: Vec<bool> = redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(redis::Script::new(script).get_hash())
            .query_async(&mut node(promoted).await)
            .await
            .unwrap();
        assert_eq!(
            exists,
            [true],
            "script missing on promoted master {promoted}"
        );
    }
    assert_eq!(keys_without_ttl(&cluster).await, Vec::<String>::new());
}

/// A replica is down (not yet flagged as failed) when the masters lose their
/// scripts (a restart, `SCRIPT FLUSH`): every script still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_scripts_reload_while_a_replica_is_down() {
    let cluster = RedisCluster::start().await;
    let store = connect(&cluster).await;
    let ttl = Duration::from_secs(10);
    let keys: Vec<String> = (0..30).map(|i| format!("nr:f:{{k{i}}}")).collect();
    for k in &keys {
        assert_eq!(store.put_if_absent(k, b"v", ttl).await.unwrap(), None);
        assert!(store.expire_if_equals(k, b"v", ttl).await.unwrap());
    }
    let masters = cluster.masters().await;
    let replica = *cluster
        .node_ports()
        .iter()
        .find(|p| !masters.contains(p))
        .unwrap();
    let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN")
        .arg("NOSAVE")
        .query_async(&mut node(replica).await)
        .await;
    for port in &masters {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut node(*port).await)
            .await
            .unwrap();
    }
    let started = Instant::now();
    for k in &keys {
        assert!(store.expire_if_equals(k, b"v", ttl).await.unwrap(), "{k}");
        assert!(store.delete_if_equals(k, b"v").await.unwrap(), "{k}");
    }
    eprintln!(
        "30 reloads with a replica down took {:?}",
        started.elapsed()
    );
}
