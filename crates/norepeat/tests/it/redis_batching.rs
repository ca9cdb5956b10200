// Over 400 lines: each rule of a pipelined claim (its answer, its cancellation, a dead connection) on one private Redis.
//! The Redis store sends the claims that arrive together as one pipeline.
//! Each claim must still get its own answer (its own value, its own server
//! error), a claim given up before its batch leaves must not be sent, and a
//! batch on a dead connection must fail every claim in it, not leave one
//! waiting.
//!
//! These run on tokio's current-thread runtime, where the batching is
//! deterministic: the claims polled together by one `join_all` are queued
//! before the task that sends them first runs. One also counts the writes
//! that leave (through the test kit's proxy): a batch is one write.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used)]

use futures_util::future::join_all;
use futures_util::{FutureExt, StreamExt};
use norepeat::store::{KeyValueStoreExt, RedisStore, StoreError};
use norepeat_testkit::{ProxyMode, RedisServer, TcpProxy};
use redis::AsyncCommands;
use std::time::Duration;

const TTL: Duration = Duration::from_secs(60);

#[tokio::test]
async fn claims_sent_together_each_get_their_own_answer() {
    let redis = RedisServer::start().await;
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let mut con = redis.connection().await;
    // Every third key is taken already, with a value of its own; one key
    // holds a hash, on which `SET ... GET` is a WRONGTYPE error.
    for i in (0..96).step_by(3) {
        let _: () = con.set(format!("k{i}"), format!("held {i}")).await.unwrap();
    }
    let _: () = con.hset("k95", "f", "v").await.unwrap();

    let keys: Vec<String> = (0..96).map(|i| format!("k{i}")).collect();
    let answers = join_all(keys.iter().map(|k| store.put_if_absent(k, b"new", TTL))).await;

    for (i, answer) in answers.into_iter().enumerate() {
        match (i, answer) {
            (95, Err(StoreError::Server(e))) => assert!(e.contains("WRONGTYPE"), "{e}"),
            (95, other) => panic!("the hash's claim answered {other:?}"),
            (i, Ok(Some(v))) if i % 3 == 0 => assert_eq!(v, format!("held {i}").as_bytes()),
            (i, Ok(None)) if i % 3 != 0 => {
                let v: Vec<u8> = con.get(format!("k{i}")).await.unwrap();
                assert_eq!(v, b"new", "k{i}");
            }
            (i, other) => panic!("k{i} answered {other:?}"),
        }
    }
    // The error stayed with its own command: the store still works.
    assert_eq!(store.put_if_absent("after", b"v", TTL).await.unwrap(), None);
}

#[tokio::test]
async fn a_claim_given_up_before_its_batch_leaves_is_not_sent() {
    let redis = RedisServer::start().await;
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    // Polled once (queued, its batch's task spawned), then dropped: the
    // caller gave up before the task ran.
    assert!(
        store
            .put_if_absent("given-up", b"v", TTL)
            .now_or_never()
            .is_none()
    );
    // Claims after it, on either connection, are answered: by then the
    // batch that held the dropped claim has been taken and sent.
    for key in ["later-1", "later-2", "later-3"] {
        assert_eq!(store.put_if_absent(key, b"v", TTL).await.unwrap(), None);
    }
    let mut con = redis.connection().await;
    let exists: bool = con.exists("given-up").await.unwrap();
    assert!(!exists, "a claim whose caller had gone was written");
    let exists: bool = con.exists("later-1").await.unwrap();
    assert!(exists);
}

#[tokio::test]
async fn a_batch_on_a_dead_server_fails_every_claim_in_it_and_the_store_recovers() {
    let mut redis = RedisServer::start().await;
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    assert_eq!(
        store.put_if_absent("before", b"v", TTL).await.unwrap(),
        None
    );

    redis.kill();
    let keys: Vec<String> = (0..32).map(|i| format!("during{i}")).collect();
    let answers = tokio::time::timeout(
        Duration::from_secs(30),
        join_all(keys.iter().map(|k| store.put_if_absent(k, b"v", TTL))),
    )
    .await
    .expect("a claim in a failed batch was left waiting");
    for (key, answer) in keys.iter().zip(answers) {
        assert!(
            matches!(
                answer,
                Err(StoreError::Connection(_) | StoreError::Timeout(_))
            ),
            "{key} answered {answer:?} with the server down"
        );
    }

    redis.restart().await;
    let mut recovered = false;
    for attempt in 0..50 {
        let keys: Vec<String> = (0..8).map(|i| format!("after{attempt}-{i}")).collect();
        let answers = join_all(keys.iter().map(|k| store.put_if_absent(k, b"v", TTL))).await;
        if answers.iter().all(|a| matches!(a, Ok(None))) {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(recovered, "the store did not come back after the restart");
}

#[tokio::test]
async fn scripts_sent_together_run_again_after_the_server_forgot_them() {
    let redis = RedisServer::start().await;
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let keys: Vec<String> = (0..16).map(|i| format!("s{i}")).collect();
    for k in &keys {
        assert_eq!(store.put_if_absent(k, b"owner", TTL).await.unwrap(), None);
    }
    // A restart or a failover forgets the scripts (SCRIPT FLUSH here): each
    // script in the next batch is answered NOSCRIPT, loaded, and sent again.
    let mut con = redis.connection().await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut con)
        .await
        .unwrap();
    let renewed = join_all(
        keys.iter()
            .map(|k| store.expire_if_equals(k, b"owner", Duration::from_secs(120))),
    )
    .await;
    assert!(renewed.into_iter().all(|r| r.unwrap()));
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut con)
        .await
        .unwrap();
    // Half the releases name the wrong owner: only the others delete.
    let released = join_all(keys.iter().enumerate().map(|(i, k)| {
        let owner: &[u8] = if i % 2 == 0 { b"owner" } else { b"someone" };
        store.delete_if_equals(k, owner)
    }))
    .await;
    for (i, r) in released.into_iter().enumerate() {
        assert_eq!(r.unwrap(), i % 2 == 0, "s{i}");
        let exists: bool = con.exists(format!("s{i}")).await.unwrap();
        assert_eq!(exists, i % 2 == 1, "s{i}");
    }
}

#[tokio::test]
async fn a_batch_whose_replies_never_come_fails_on_its_own() {
    let redis = RedisServer::start().await;
    let proxy = TcpProxy::start(redis.addr()).await;
    // The bare store, with no timeout of the guards around it: only the
    // connection's own response timeout can end these calls.
    let store = RedisStore::connect(&proxy.url_for_redis()).await.unwrap();
    assert_eq!(
        store.put_if_absent("before", b"v", TTL).await.unwrap(),
        None
    );

    proxy.set_mode(ProxyMode::Swallow);
    let keys: Vec<String> = (0..16).map(|i| format!("swallowed{i}")).collect();
    let answers = tokio::time::timeout(
        Duration::from_secs(10),
        join_all(keys.iter().map(|k| store.put_if_absent(k, b"v", TTL))),
    )
    .await
    .expect("a batch on a connection that never answers was left waiting");
    for (key, answer) in keys.iter().zip(answers) {
        assert!(
            matches!(
                answer,
                Err(StoreError::Timeout(_) | StoreError::Connection(_))
            ),
            "{key} answered {answer:?} with its replies swallowed"
        );
    }
}

/// Every command on one key leaves on one connection (each key has its
/// connection, by a hash of the key), so a release sent after a completion
/// cannot overtake it on another connection. Checked with MONITOR, which
/// names the client of each command: with the connections used in turn
/// (before), a key's claim, renewal, completion and release went out on
/// alternating connections.
#[tokio::test]
async fn the_commands_on_one_key_leave_on_one_connection() {
    let redis = RedisServer::start().await;
    let store = RedisStore::connect_with(&redis.url(), 4).await.unwrap();
    // Load the scripts first, so MONITOR sees only the calls below.
    assert_eq!(store.put_if_absent("warm", b"o", TTL).await.unwrap(), None);
    assert!(store.expire_if_equals("warm", b"o", TTL).await.unwrap());
    assert!(
        store
            .replace_if_equals("warm", b"o", b"d", TTL)
            .await
            .unwrap()
    );
    assert!(store.delete_if_equals("warm", b"d").await.unwrap());

    let monitor = redis.client().get_async_monitor().await.unwrap();
    let mut lines = monitor.into_on_message::<String>();

    let keys: Vec<String> = (0..8).map(|i| format!("ordered{i}")).collect();
    for key in &keys {
        assert_eq!(store.put_if_absent(key, b"claim", TTL).await.unwrap(), None);
        assert!(store.expire_if_equals(key, b"claim", TTL).await.unwrap());
        assert!(
            store
                .replace_if_equals(key, b"claim", b"done", TTL)
                .await
                .unwrap()
        );
        assert!(!store.delete_if_equals(key, b"claim").await.unwrap());
    }

    // Each line: `<time> [<db> <client address>] "CMD" "arg" ...`; a
    // script's own commands name `lua` as their client and are skipped.
    let mut clients: std::collections::HashMap<String, std::collections::HashSet<String>> =
        std::collections::HashMap::new();
    let mut seen = 0;
    while seen < keys.len() * 4 {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next())
            .await
            .expect("MONITOR showed every command")
            .expect("the monitor stays open");
        let Some((client, command)) = line
            .split_once('[')
            .and_then(|(_, rest)| rest.split_once(']'))
        else {
            continue;
        };
        let client = client.split_whitespace().nth(1).unwrap_or("").to_owned();
        if client == "lua" {
            continue;
        }
        let args: Vec<&str> = command.split_whitespace().collect();
        let key = match args.first().map(|c| c.to_ascii_uppercase()) {
            Some(c) if c == "\"SET\"" => args[1],
            Some(c) if c == "\"EVALSHA\"" => args[3],
            _ => continue,
        };
        let key = key.trim_matches('"').to_owned();
        if keys.contains(&key) {
            seen += 1;
            clients.entry(key).or_default().insert(client);
        }
    }
    for key in &keys {
        assert_eq!(
            clients[key].len(),
            1,
            "{key} went out on connections {:?}",
            clients[key]
        );
    }
    let used: std::collections::HashSet<&String> = clients.values().flatten().collect();
    assert!(used.len() > 1, "the keys spread over the connections");
}

/// The store's own runtime, a private Redis and a store on it with one
/// connection (every call shares one queue).
fn one_connection_store() -> (tokio::runtime::Runtime, RedisServer, RedisStore) {
    let home = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (redis, store) = home.block_on(async {
        let redis = RedisServer::start().await;
        let store = RedisStore::connect_with(&redis.url(), 1).await.unwrap();
        (redis, store)
    });
    (home, redis, store)
}

/// A runtime that runs only what `block_on` polls, shut down by the test
/// before a task spawned on it runs.
fn throwaway_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A call polled once in a runtime that is then shut down leaves its
/// batch's task unrun (dropped with that runtime). The next calls, in the
/// store's own runtime, must still be sent; before, the queue stayed
/// non-empty with no task to take it, and every later call on that
/// connection waited forever.
#[test]
fn a_batch_task_dropped_with_its_runtime_does_not_stall_the_queue() {
    let (home, redis, store) = one_connection_store();
    let throwaway = throwaway_runtime();
    let mut stranded = Box::pin(store.put_if_absent("stranded", b"v", TTL));
    throwaway.block_on(async {
        assert!((&mut stranded).now_or_never().is_none());
    });
    drop(throwaway);
    drop(stranded);

    home.block_on(async {
        for key in ["next-1", "next-2", "next-3"] {
            let answer =
                tokio::time::timeout(Duration::from_secs(10), store.put_if_absent(key, b"v", TTL))
                    .await
                    .expect("a call after a dropped batch task was never sent");
            assert_eq!(answer.unwrap(), None, "{key}");
        }
    });
    drop(store);
    home.block_on(async move { drop(redis) });
}

/// A call queued behind another runtime's batch task (it found the task
/// due, so spawned none) must not wait forever when that runtime shuts
/// down before the task ran: it fails at once, and the queue goes on. (A
/// store shared by several runtimes: a thread-per-core server, a
/// process-wide store.) Before, it waited until some later call on its
/// connection took the queue: forever, on a quiet one.
#[test]
fn a_call_queued_behind_a_dropped_batch_task_fails_instead_of_waiting() {
    let (home, redis, store) = one_connection_store();
    // The first call, on a runtime of its own, spawns the batch task there;
    // the runtime stops before that task runs.
    let throwaway = throwaway_runtime();
    let mut first = Box::pin(store.put_if_absent("first", b"v", TTL));
    throwaway.block_on(async {
        assert!((&mut first).now_or_never().is_none());
    });
    // The second call, on the store's own runtime, queues behind it.
    let mut second = Box::pin(store.put_if_absent("second", b"v", TTL));
    home.block_on(async {
        assert!((&mut second).now_or_never().is_none());
    });
    drop(throwaway);
    drop(first);

    home.block_on(async {
        let answer = tokio::time::timeout(Duration::from_secs(5), second)
            .await
            .expect("a call queued behind a dropped batch task waited on");
        assert!(
            matches!(answer, Err(StoreError::Connection(_))),
            "{answer:?}"
        );
        // Nothing was sent for it, and the queue goes on.
        let mut con = redis.connection().await;
        let second: Option<Vec<u8>> = con.get("second").await.unwrap();
        assert_eq!(second, None);
        assert_eq!(store.put_if_absent("third", b"v", TTL).await.unwrap(), None);
    });
    drop(store);
    home.block_on(async move { drop(redis) });
}

/// The batching happens: 96 claims made together leave in a handful of
/// writes, one pipeline per connection, not one write each. The proxy in
/// front of Redis counts the chunks it reads from the store's connections.
///
/// As in a server, the connections' tasks (and the proxy) run on a
/// multi-thread runtime, where a connection's task writes whatever is in
/// its channel as soon as it is there. The claims are made on a
/// current-thread runtime, a millisecond apart (a handler's work before its
/// claim), all within one turn of it. With the queue, the batch task runs
/// after that turn and sends each connection's 48 claims as one pipeline:
/// 2 writes. Without it (checked: each command handed to its connection as
/// it is called), each claim left in its own write: 96, three runs out of
/// three.
#[test]
fn claims_sent_together_leave_in_one_write_per_connection() {
    let io = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (redis, proxy, store) = io.block_on(async {
        let redis = RedisServer::start().await;
        let proxy = TcpProxy::start(redis.addr()).await;
        let store = RedisStore::connect(&proxy.url_for_redis()).await.unwrap();
        // One claim on each connection first (`k0` and `k1` hash to the
        // two), so nothing but the 96 claims is counted below.
        assert_eq!(store.put_if_absent("k0", b"v", TTL).await.unwrap(), None);
        assert_eq!(store.put_if_absent("k1", b"v", TTL).await.unwrap(), None);
        (redis, proxy, store)
    });

    let callers = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let before = proxy.forwarded_writes();
    let keys: Vec<String> = (0..96).map(|i| format!("together{i}")).collect();
    let answers = callers.block_on(join_all(keys.iter().map(|k| async {
        // The work a handler does before its claim: the claims reach the
        // store a millisecond apart, within one turn of this runtime.
        std::thread::sleep(Duration::from_millis(1));
        store.put_if_absent(k, b"new", TTL).await
    })));
    let writes = proxy.forwarded_writes() - before;

    for (key, answer) in keys.iter().zip(answers) {
        assert_eq!(answer.unwrap(), None, "{key}");
    }
    // Two pipelines (one per connection, 48 keys each by their hash); a
    // little slack should a pipeline be read in two pieces.
    assert!(
        writes <= 4,
        "96 claims sent together left in {writes} writes, not one per connection"
    );
    drop(store);
    drop(callers);
    io.block_on(async move {
        drop(proxy);
        drop(redis);
    });
}
