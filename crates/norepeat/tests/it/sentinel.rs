//! A Redis behind Sentinel (`redis+sentinel://`), against the test kit's
//! master, two replicas and three Sentinels on loopback: the store finds
//! the master, follows it when it is killed (SIGKILL) or demoted, and
//! leaves the old one; under load across two instances, with
//! `replicas=1`, no request's claim is made twice across the failover.
//!
//! Each test starts its own group (some seconds to form, some to fail
//! over). No assertion is on timing: the figures are printed.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used)]

use crate::common::{eventually_within, node};
use norepeat::store::{KeyValueStoreExt, RedisStore};
use norepeat_testkit::RedisSentinels;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TTL: Duration = Duration::from_secs(120);

/// How long a failover may take on a busy two-core machine before a test
/// calls the store lost.
const FAILOVER_PATIENCE: Duration = Duration::from_secs(60);

/// Whether the server at `port` holds `key`.
async fn holds(port: u16, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(&mut node(port).await)
        .await
        .unwrap()
        == 1
}

/// Claims a fresh key every 50 ms until a claim succeeds; the key and the
/// time from `since`.
async fn first_claim_after(store: &RedisStore, since: Instant, prefix: &str) -> (String, Duration) {
    for n in 0.. {
        let key = format!("{prefix}:{n}");
        if matches!(store.put_if_absent(&key, b"a", TTL).await, Ok(None)) {
            return (key, since.elapsed());
        }
        assert!(
            since.elapsed() < FAILOVER_PATIENCE,
            "the store never reached a new master"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    unreachable!()
}

/// The master is killed: the store's calls fail until the Sentinels
/// promote a replica, then go there, with no new store. Before: the
/// store had no Sentinel URL; a `redis://` URL of the master kept
/// reconnecting to the dead port for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_follows_its_master_when_the_master_is_killed() {
    let mut group = RedisSentinels::start().await;
    let store = RedisStore::connect(&group.url()).await.unwrap();
    let first = group.master_port().await;
    assert_eq!(
        store.put_if_absent("before", b"a", TTL).await.unwrap(),
        None
    );
    assert!(holds(first, "before").await);

    let old = group.kill_master().await;
    assert_eq!(old, first);
    let killed = Instant::now();
    let (key, took) = first_claim_after(&store, killed, "after").await;
    let new = group.wait_for_failover(old).await;
    assert_ne!(new, old);
    assert!(holds(new, &key).await, "{key} is on the new master {new}");
    eprintln!("first claim on the new master {took:?} after the SIGKILL");
}

/// The master is demoted (a failover asked of Sentinel: it stays up, as
/// a replica): the store's writes there would be answered `READONLY`. The
/// store moves to the new master, and no connection of its stays at the
/// old one. Before: redis-rs's connection manager reconnected to the
/// demoted master, and every claim was refused there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_leaves_a_demoted_master() {
    let group = RedisSentinels::start().await;
    let store = RedisStore::connect(&group.url()).await.unwrap();
    assert_eq!(
        store.put_if_absent("before", b"a", TTL).await.unwrap(),
        None
    );
    let old = group.master_port().await;
    let new = group.demote_master().await;
    assert_ne!(new, old);
    let demoted = Instant::now();
    let (key, took) = first_claim_after(&store, demoted, "after").await;
    assert!(holds(new, &key).await, "{key} is on the new master {new}");
    eprintln!("first claim on the new master {took:?} after the old one was demoted");

    // On the old master, only the Sentinels, its own link to the new
    // master and this query remain.
    let stayed = eventually_within(
        Duration::from_secs(10),
        "the store to leave the old master",
        || async {
            let list: String = redis::cmd("CLIENT")
                .arg("LIST")
                .query_async(&mut node(old).await)
                .await
                .ok()?;
            let ours: Vec<String> = list
                .lines()
                .filter(|l| {
                    !l.contains("name=sentinel-")
                        && !l.contains("flags=M")
                        && !l.contains("cmd=client|list")
                })
                .map(str::to_owned)
                .collect();
            ours.is_empty().then_some(())
        },
    )
    .await;
    let () = stayed;
}

/// What a storm across a failover did.
#[derive(Debug, Default)]
struct Storm {
    /// Requests answered (each once, maybe after retries).
    requests: usize,
    /// Requests whose claim was made (the effect ran once).
    effects: usize,
    /// Requests never claimed by their own tries: a try failed after
    /// its claim ran (the outcome was unknown, so no effect ran), and a
    /// later try found the claim held.
    unknown: usize,
    /// Requests claimed again by a late duplicate after the failover: the
    /// new master did not have their claim, so their effect would run
    /// twice.
    twice: usize,
}

/// Four clients send requests one after another, each a fresh key, over
/// two store instances; a request whose claim fails (no answer, or not
/// acknowledged by the replicas asked for) is tried again on the other
/// instance until one answers. The master is killed with SIGKILL in the
/// middle; the storm goes on until the Sentinels promoted a replica and a
/// while after. Then every request whose effect ran is sent once more (a
/// late duplicate, the other instance): a claim the new master does not
/// have is made again.
async fn storm(url_query: &str) -> Storm {
    let mut group = RedisSentinels::start().await;
    let url = format!("{}{url_query}", group.url());
    let instances = Arc::new([
        RedisStore::connect(&url).await.unwrap(),
        RedisStore::connect(&url).await.unwrap(),
    ]);
    let effects: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let unknown = Arc::new(Mutex::new(0_usize));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (instances, effects, unknown, stop) = (
                Arc::clone(&instances),
                Arc::clone(&effects),
                Arc::clone(&unknown),
                Arc::clone(&stop),
            );
            tokio::spawn(async move {
                let mut requests = 0;
                while !stop.load(Ordering::SeqCst) {
                    requests += 1;
                    let key = format!("order:{c}:{requests}");
                    let began = Instant::now();
                    for attempt in 0.. {
                        let store = &instances[(c + attempt) % 2];
                        match store.put_if_absent(&key, b"claim", TTL).await {
                            Ok(None) => {
                                *effects.lock().unwrap().entry(key).or_default() += 1;
                                break;
                            }
                            Ok(Some(_)) => {
                                *unknown.lock().unwrap() += 1;
                                break;
                            }
                            Err(_) => {
                                assert!(
                                    began.elapsed() < FAILOVER_PATIENCE,
                                    "{key}: no instance answered"
                                );
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                        }
                    }
                }
                requests
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let old = group.kill_master().await;
    let new = group.wait_for_failover(old).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::SeqCst);
    let mut requests = 0;
    for c in clients {
        requests += c.await.unwrap();
    }
    let effects = std::mem::take(&mut *effects.lock().unwrap());
    let mut storm = Storm {
        requests,
        effects: effects.len(),
        unknown: *unknown.lock().unwrap(),
        twice: 0,
    };
    for (key, runs) in &effects {
        assert_eq!(*runs, 1, "{key}: claimed twice during the storm");
        let again = loop {
            match instances[1].put_if_absent(key, b"late", TTL).await {
                Ok(answer) => break answer,
                Err(e) => eprintln!("{key}: late duplicate failed ({e}), again"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        if again.is_none() {
            storm.twice += 1;
        }
    }
    eprintln!("master {old} killed, {new} promoted: {storm:?}");
    storm
}

/// With `replicas=1`, a claim is answered only once a replica has it: the
/// promoted replica (Sentinel promotes the one furthest along) has every
/// claim that was answered, so no request's effect runs twice, neither
/// during the storm nor for a late duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replicas_1_no_request_runs_twice_across_a_failover() {
    let storm = storm("?replicas=1&replicas_timeout=200ms").await;
    assert!(storm.effects > 0, "{storm:?}");
    assert_eq!(storm.requests, storm.effects + storm.unknown, "{storm:?}");
    assert_eq!(storm.twice, 0, "{storm:?}");
}

/// With `replicas=0` (the default), a claim answered by the master in the
/// moments before it died may not have reached the replica promoted: a
/// late duplicate then runs its effect again. Only what is guaranteed is
/// asserted (each request answered, none claimed twice by its own
/// retries while the master lived); how many were lost is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replicas_0_a_failover_may_lose_claims() {
    let storm = storm("").await;
    assert!(storm.effects > 0, "{storm:?}");
    assert_eq!(storm.requests, storm.effects + storm.unknown, "{storm:?}");
    eprintln!(
        "replicas=0: {} of {} claims lost in the failover (their effects would run twice)",
        storm.twice, storm.effects
    );
}
