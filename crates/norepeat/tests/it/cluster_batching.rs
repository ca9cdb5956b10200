// Over 400 lines: one cluster's pipelines per master, each rule of redis_batching.rs again where a batch spans masters, sharing one cluster set-up.
//! The cluster store sends the claims that arrive together as one pipeline
//! per master, on a real Redis Cluster from the test kit (3 masters, 3
//! replicas). As on one Redis (`redis_batching.rs`): each claim gets its
//! own answer, a claim given up before its batch leaves is not sent, a
//! batch on a dead master fails its own claims and no others, and the
//! claims do leave together. And while a slot moves between masters
//! (`ASK`, then `MOVED`), every claim is answered as if it had not moved:
//! no first caller is told its key is taken.
//!
//! Each test starts its own cluster (nextest runs them one at a time).
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used)]

use crate::common::node;
use futures_util::FutureExt;
use futures_util::future::join_all;
use norepeat::store::{ClusterStore, KeyValueStoreExt, StoreError};
use norepeat_testkit::RedisCluster;
use redis::AsyncCommands;
use redis::cluster_async::ClusterConnection;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const TTL: Duration = Duration::from_secs(60);

async fn connect(cluster: &RedisCluster) -> ClusterStore {
    ClusterStore::connect(&cluster.node_urls()).await.unwrap()
}

/// A plain cluster client, to set up and check keys.
async fn plain(cluster: &RedisCluster) -> ClusterConnection {
    redis::cluster::ClusterClient::new(cluster.node_urls())
        .unwrap()
        .get_async_connection()
        .await
        .unwrap()
}

/// The master (port) that serves each of `keys`, by `CLUSTER KEYSLOT`
/// and `CLUSTER SLOTS` on a live master.
async fn masters_of(cluster: &RedisCluster, keys: &[String]) -> Vec<u16> {
    let masters = cluster.masters().await;
    let mut con = node(masters[0]).await;
    let slots: Vec<(u16, u16, u16)> = {
        let answer: Vec<redis::Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut con)
            .await
            .unwrap();
        answer
            .into_iter()
            .map(|range| {
                let redis::Value::Array(parts) = range else {
                    panic!("CLUSTER SLOTS: {range:?}")
                };
                let redis::Value::Array(master) = &parts[2] else {
                    panic!("CLUSTER SLOTS: {parts:?}")
                };
                (
                    redis::from_redis_value(parts[0].clone()).unwrap(),
                    redis::from_redis_value(parts[1].clone()).unwrap(),
                    redis::from_redis_value(master[1].clone()).unwrap(),
                )
            })
            .collect()
    };
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut con)
            .await
            .unwrap();
        let (_, _, port) = slots
            .iter()
            .find(|(from, to, _)| (*from..=*to).contains(&slot))
            .unwrap();
        out.push(*port);
    }
    out
}

/// One field of `INFO <section>` on `con`.
async fn info_on(
    con: &mut redis::aio::MultiplexedConnection,
    section: &str,
    field: &str,
) -> Option<String> {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query_async(con)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_owned())
}

/// One field of `INFO <section>` on the node at `port`.
async fn info_field(port: u16, section: &str, field: &str) -> Option<String> {
    info_on(&mut node(port).await, section, field).await
}

/// The reads of client connections a node has made (`INFO stats`), on an
/// open connection: each call adds its own one read.
async fn reads_processed(con: &mut redis::aio::MultiplexedConnection) -> u64 {
    info_on(con, "stats", "total_reads_processed")
        .await
        .unwrap()
        .parse()
        .unwrap()
}

/// `calls` of `INFO commandstats` for `command` (0 when never called).
async fn calls_of(port: u16, command: &str) -> u64 {
    info_field(port, "commandstats", &format!("cmdstat_{command}"))
        .await
        .and_then(|v| {
            v.split(',')
                .find_map(|f| f.strip_prefix("calls="))
                .map(|n| n.parse().unwrap())
        })
        .unwrap_or(0)
}

/// How many `MOVED` answers the node at `port` gave (`INFO errorstats`).
async fn moved_answers(port: u16) -> u64 {
    info_field(port, "errorstats", "errorstat_MOVED")
        .await
        .and_then(|v| v.strip_prefix("count=").map(|n| n.parse().unwrap()))
        .unwrap_or(0)
}

#[tokio::test]
async fn claims_on_every_master_each_get_their_own_answer() {
    let cluster = RedisCluster::start().await;
    let store = connect(&cluster).await;
    let mut con = plain(&cluster).await;
    let keys: Vec<String> = (0..300).map(|i| format!("k{i}")).collect();
    // Every third key is taken already, with a value of its own; one key
    // holds a hash, on which `SET ... GET` is a WRONGTYPE error.
    for i in (0..300).step_by(3) {
        let _: () = con.set(&keys[i], format!("held {i}")).await.unwrap();
    }
    let _: () = con.hset("k299", "f", "v").await.unwrap();
    let masters = masters_of(&cluster, &keys).await;
    for port in cluster.masters().await {
        assert!(masters.contains(&port), "no key on master {port}");
    }

    let answers = join_all(keys.iter().map(|k| store.put_if_absent(k, b"new", TTL))).await;

    for (i, answer) in answers.into_iter().enumerate() {
        match (i, answer) {
            (299, Err(StoreError::Server(e))) => assert!(e.contains("WRONGTYPE"), "{e}"),
            (299, other) => panic!("the hash's claim answered {other:?}"),
            (i, Ok(Some(v))) if i % 3 == 0 => assert_eq!(v, format!("held {i}").as_bytes()),
            (i, Ok(None)) if i % 3 != 0 => {
                let v: Vec<u8> = con.get(&keys[i]).await.unwrap();
                assert_eq!(v, b"new", "k{i}");
            }
            (i, other) => panic!("k{i} answered {other:?}"),
        }
    }
    // Scripts share the batches too, each with its own answer.
    let released = join_all(keys[1..30].iter().enumerate().map(|(i, k)| {
        let owner: &[u8] = if i % 2 == 0 { b"new" } else { b"someone" };
        store.delete_if_equals(k, owner)
    }))
    .await;
    for (i, r) in released.into_iter().enumerate() {
        let key = &keys[i + 1];
        let held_before = (i + 1) % 3 == 0;
        assert_eq!(r.unwrap(), i % 2 == 0 && !held_before, "{key}");
    }
    // The error stayed with its own command: the store still works.
    assert_eq!(store.put_if_absent("after", b"v", TTL).await.unwrap(), None);
}

#[tokio::test]
async fn a_claim_given_up_before_its_batch_leaves_is_not_sent() {
    let cluster = RedisCluster::start().await;
    let store = connect(&cluster).await;
    // Polled once (queued, its batch's task spawned), then dropped: the
    // caller gave up before the task ran.
    assert!(
        store
            .put_if_absent("given-up", b"v", TTL)
            .now_or_never()
            .is_none()
    );
    // Later claims on every master are answered: by then the batch that
    // held the dropped claim has been taken and sent.
    let later: Vec<String> = (0..30).map(|i| format!("later-{i}")).collect();
    for key in &later {
        assert_eq!(store.put_if_absent(key, b"v", TTL).await.unwrap(), None);
    }
    let mut con = plain(&cluster).await;
    let exists: bool = con.exists("given-up").await.unwrap();
    assert!(!exists, "a claim whose caller had gone was written");
    let exists: bool = con.exists("later-0").await.unwrap();
    assert!(exists);
}

#[tokio::test]
async fn a_batch_on_a_dead_master_fails_only_its_own_claims() {
    let mut cluster = RedisCluster::start().await;
    let store = connect(&cluster).await;
    let before: Vec<String> = (0..30).map(|i| format!("before{i}")).collect();
    for answer in join_all(before.iter().map(|k| store.put_if_absent(k, b"v", TTL))).await {
        assert_eq!(answer.unwrap(), None);
    }
    let keys: Vec<String> = (0..60).map(|i| format!("during{i}")).collect();
    let owners = masters_of(&cluster, &keys).await;

    let killed = cluster.kill_master(0).await;
    assert!(owners.contains(&killed) && owners.iter().any(|p| *p != killed));
    let answers = tokio::time::timeout(
        Duration::from_secs(30),
        join_all(keys.iter().map(|k| store.put_if_absent(k, b"v", TTL))),
    )
    .await
    .expect("a claim in a failed batch was left waiting");
    for ((key, owner), answer) in keys.iter().zip(&owners).zip(answers) {
        if *owner == killed {
            assert!(
                matches!(
                    answer,
                    Err(StoreError::Connection(_) | StoreError::Timeout(_))
                ),
                "{key} answered {answer:?} with its master dead"
            );
        } else {
            assert_eq!(answer.unwrap(), None, "{key}, on a live master");
        }
    }

    // Once a replica has taken the slots over, the store finds it.
    cluster.wait_for_failover().await;
    let victims: Vec<&String> = keys
        .iter()
        .zip(&owners)
        .filter(|(_, o)| **o == killed)
        .map(|(k, _)| k)
        .collect();
    let mut recovered = false;
    for _ in 0..100 {
        let answers = join_all(victims.iter().map(|k| store.put_if_absent(k, b"v", TTL))).await;
        if answers.iter().all(|a| matches!(a, Ok(None))) {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        recovered,
        "the claims on the killed master's slots never came back"
    );
}

/// The batching happens: 96 claims made together reach the masters in a
/// handful of reads (Redis's `total_reads_processed`), one pipeline per
/// master, not one read each.
///
/// As in `redis_batching.rs`: the connections' tasks run on a
/// multi-thread runtime; the claims are made on a current-thread runtime,
/// a millisecond apart, within one turn of it. The same claims sent one by
/// one through the cluster client (what the store did before) are counted
/// too, as the yardstick.
#[test]
fn claims_sent_together_leave_in_one_write_per_master() {
    let io = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (cluster, store, plain, masters, mut infos) = io.block_on(async {
        let cluster = RedisCluster::start().await;
        let store = connect(&cluster).await;
        let plain = plain(&cluster).await;
        // A claim on every master first, so every connection is made.
        let warm: Vec<String> = (0..30).map(|i| format!("warm{i}")).collect();
        for k in &warm {
            assert_eq!(store.put_if_absent(k, b"v", TTL).await.unwrap(), None);
            let _: Option<String> = plain.clone().get(k).await.unwrap();
        }
        let masters = cluster.masters().await;
        let mut infos = Vec::new();
        for port in &masters {
            infos.push(node(*port).await);
        }
        (cluster, store, plain, masters, infos)
    });
    let mut reads = |_: &[u16]| {
        io.block_on(async {
            let mut total = 0;
            for con in &mut infos {
                total += reads_processed(con).await;
            }
            total
        })
    };
    let callers = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    let keys: Vec<String> = (0..96).map(|i| format!("together{i}")).collect();
    let before = reads(&masters);
    let answers = callers.block_on(join_all(keys.iter().map(|k| async {
        // The work a handler does before its claim.
        std::thread::sleep(Duration::from_millis(1));
        store.put_if_absent(k, b"new", TTL).await
    })));
    // Less the `INFO` reads themselves (one per master).
    let batched = reads(&masters) - before - masters.len() as u64;
    for (key, answer) in keys.iter().zip(answers) {
        assert_eq!(answer.unwrap(), None, "{key}");
    }

    let alone: Vec<String> = (0..96).map(|i| format!("alone{i}")).collect();
    let before = reads(&masters);
    let answers = callers.block_on(join_all(alone.iter().map(|k| {
        let mut con = plain.clone();
        async move {
            std::thread::sleep(Duration::from_millis(1));
            redis::cmd("SET")
                .arg(k)
                .arg("new")
                .arg("NX")
                .arg("PX")
                .arg(60_000)
                .arg("GET")
                .query_async::<Option<String>>(&mut con)
                .await
        }
    })));
    let unbatched = reads(&masters) - before - masters.len() as u64;
    for answer in answers {
        assert_eq!(answer.unwrap(), None);
    }
    eprintln!("96 claims: {batched} reads on the masters batched, {unbatched} one by one");
    // One pipeline per master; a little slack for a pipeline read in two
    // pieces, and a replica's REPLCONF ACK (one a second per replica).
    assert!(
        batched <= 2 * masters.len() as u64 + 2,
        "96 claims sent together took {batched} reads on {} masters",
        masters.len()
    );
    drop(store);
    drop(callers);
    io.block_on(async move {
        drop(plain);
        drop(cluster);
    });
}

/// A slot moves from one master to another (`CLUSTER SETSLOT ...
/// MIGRATING/IMPORTING`, `MIGRATE`, `SETSLOT ... NODE`) between the
/// store's batches: while it moves, the claims on keys already moved, or
/// not yet written, are answered `ASK` by the old master; once it has
/// moved, every claim sent there is answered `MOVED`. Claims on fresh keys
/// of the slot also run all along, between every step. Only the redirected
/// claims are sent again, so every claim is answered as if nothing moved:
/// each first claim
/// of a key admitted (a whole batch sent again would have found its own
/// writes and refused them), every taken key refused with its value.
#[tokio::test]
async fn claims_while_a_slot_moves_are_answered_right() {
    let cluster = RedisCluster::start().await;
    let masters = cluster.masters().await;
    let (from, to) = (masters[0], masters[1]);
    let mut src = node(from).await;
    let mut dst = node(to).await;
    let id = |port: u16| async move {
        let id: String = redis::cmd("CLUSTER")
            .arg("MYID")
            .query_async(&mut node(port).await)
            .await
            .unwrap();
        id
    };
    let (from_id, to_id) = (id(from).await, id(to).await);
    // A hash tag whose slot `from` serves: every key below is in it.
    let mut tag = String::new();
    for i in 0.. {
        tag = format!("moving{i}");
        if masters_of(&cluster, std::slice::from_ref(&tag)).await[0] == from {
            break;
        }
    }
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(&tag)
        .query_async(&mut src)
        .await
        .unwrap();
    let key = |what: &str, i: usize| format!("{{{tag}}}:{what}{i}");

    let store = connect(&cluster).await;
    let mut con = plain(&cluster).await;
    for i in 0..20 {
        let _: () = con
            .set_ex(key("old", i), format!("held {i}"), 600)
            .await
            .unwrap();
    }
    let asking_before = calls_of(to, "asking").await;

    // Claims on fresh keys of the slot run all along, between every step
    // of the move below: each must be admitted.
    let stop = Arc::new(AtomicBool::new(false));
    let background = tokio::spawn({
        let (store, stop, tag) = (store.clone(), Arc::clone(&stop), tag.clone());
        async move {
            let mut n = 0;
            let mut refused = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let keys: Vec<String> = (n..n + 8).map(|i| format!("{{{tag}}}:bg{i}")).collect();
                n += 8;
                let answers =
                    join_all(keys.iter().map(|k| store.put_if_absent(k, b"bg", TTL))).await;
                for (k, answer) in keys.into_iter().zip(answers) {
                    if !matches!(answer, Ok(None)) {
                        refused.push(format!("{k}: {answer:?}"));
                    }
                }
                tokio::task::yield_now().await;
            }
            (n, refused)
        }
    });

    // The slot starts moving; the even old keys move first.
    let _: () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("IMPORTING")
        .arg(&from_id)
        .query_async(&mut dst)
        .await
        .unwrap();
    let _: () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("MIGRATING")
        .arg(&to_id)
        .query_async(&mut src)
        .await
        .unwrap();
    let migrate = |keys: Vec<String>| {
        let mut cmd = redis::cmd("MIGRATE");
        cmd.arg("127.0.0.1")
            .arg(to)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(keys);
        cmd
    };
    let _: () = migrate((0..20).step_by(2).map(|i| key("old", i)).collect())
        .query_async(&mut src)
        .await
        .unwrap();

    // While it moves: the old keys (half here, half there), fresh keys,
    // and fresh keys claimed twice in one batch.
    let mut claims: Vec<(String, Vec<u8>)> = Vec::new();
    for i in 0..20 {
        claims.push((key("old", i), b"new".to_vec()));
        claims.push((key("fresh", i), b"new".to_vec()));
    }
    for i in 0..10 {
        claims.push((key("twice", i), b"first".to_vec()));
        claims.push((key("twice", i), b"second".to_vec()));
    }
    let answers = join_all(
        claims
            .iter()
            .map(|(k, v)| store.put_if_absent(k, v.as_slice(), TTL)),
    )
    .await;
    let mut admitted: HashMap<&str, Vec<u8>> = HashMap::new();
    for ((k, v), answer) in claims.iter().zip(answers) {
        let answer = answer.unwrap_or_else(|e| panic!("{k} failed while its slot moved: {e}"));
        if let Some((_, i)) = k.rsplit_once(":old") {
            assert_eq!(
                answer.as_deref(),
                Some(format!("held {i}").as_bytes()),
                "{k}"
            );
        } else if k.contains(":fresh") {
            assert_eq!(answer, None, "{k}: the first claim of a key was refused");
        } else if answer.is_none() {
            assert!(
                admitted.insert(k, v.clone()).is_none(),
                "{k} admitted twice"
            );
        }
    }
    for i in 0..10 {
        let k = key("twice", i);
        let winner = admitted
            .get(k.as_str())
            .expect("one of two claims admitted");
        let loser: &[u8] = if winner == b"first" {
            b"second"
        } else {
            b"first"
        };
        // The other claim was told whose value holds the key.
        let held: Vec<u8> = con.get(&k).await.unwrap();
        assert_eq!(&held, winner, "{k}");
        assert_ne!(held, loser);
    }
    assert!(
        calls_of(to, "asking").await > asking_before,
        "no claim was redirected with ASK"
    );

    // The rest moves, and the slot is `to`'s: the store's map still says
    // `from`, which answers MOVED (to the background claims first, or to
    // the claims below).
    let moved_before = moved_answers(from).await;
    loop {
        let left: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(100)
            .query_async(&mut src)
            .await
            .unwrap();
        if left.is_empty() {
            break;
        }
        let _: () = migrate(left).query_async(&mut src).await.unwrap();
    }
    for con in [&mut dst, &mut src] {
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("NODE")
            .arg(&to_id)
            .query_async(con)
            .await
            .unwrap();
    }
    let sets_on_to = calls_of(to, "set").await;
    let after: Vec<String> = (0..20).map(|i| key("after", i)).collect();
    let answers = join_all(after.iter().map(|k| store.put_if_absent(k, b"new", TTL))).await;
    for (k, answer) in after.iter().zip(answers) {
        assert_eq!(
            answer.unwrap(),
            None,
            "{k}: the first claim of a key was refused"
        );
    }
    let answers =
        join_all((0..20).map(|i| store.put_if_absent(&claims[2 * i + 1].0, b"x", TTL))).await;
    for answer in answers {
        assert_eq!(answer.unwrap().as_deref(), Some(&b"new"[..]));
    }
    assert!(
        moved_answers(from).await > moved_before,
        "no claim was redirected with MOVED"
    );
    // Every claim reached `to`, where the keys now are.
    assert!(calls_of(to, "set").await >= sets_on_to + 40);
    stop.store(true, Ordering::Relaxed);
    let (background, refused) = background.await.unwrap();
    assert!(
        refused.is_empty(),
        "claims made while the slot moved: {refused:?}"
    );
    assert!(background >= 16, "the background claims ran along");
    let on_to: u64 = redis::cmd("CLUSTER")
        .arg("COUNTKEYSINSLOT")
        .arg(slot)
        .query_async(&mut dst)
        .await
        .unwrap();
    assert_eq!(on_to, 20 + 20 + 10 + 20 + background);
}
