//! Issue 39: one event loop per core. `--workers N` serves on N threads,
//! each with a listening socket of its own (`SO_REUSEPORT`); the
//! guarantees hold across them: one key is one effect whichever worker
//! each connection landed on. `--work-stealing` serves on tokio's
//! work-stealing runtime, one socket, with the same guarantees.

use crate::common::*;

/// The listening sockets on `port` (`/proc/net/tcp`, state `0A`).
fn listening_sockets(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let local = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            fields.get(1).is_some_and(|a| a.ends_with(&local)) && fields.get(3) == Some(&"0A")
        })
        .count()
}

/// The names of the process's threads.
fn threads(g: &Process) -> Vec<String> {
    let pid = g.process.pid().expect("running");
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_owned())
        .collect()
}

/// 16 clients of their own (new connections, new source ports: the
/// kernel spreads them between the sockets), spread over `gateways`, send
/// one key at once, each
/// held 300 ms by the backend: it runs once; the others are told it is in
/// progress (409) or get its replay.
async fn one_key_one_effect(gateways: &[&Process], b: &Process) {
    let key = format!("k-{}", rand_n());
    let mut sent = tokio::task::JoinSet::new();
    for i in 0..16 {
        let g = gateways[i % gateways.len()];
        let (to, key) = (url(g, "/payments"), key.clone());
        sent.spawn(async move {
            let res = Client::new()
                .post(to)
                .header("x-user-id", "u1")
                .header("idempotency-key", key)
                .header("x-delay", "0.3")
                .body("{}")
                .send()
                .await
                .unwrap();
            let replayed = res.headers().contains_key("idempotent-replayed");
            (res.status(), replayed)
        });
    }
    let mut ran = 0;
    while let Some(answer) = sent.join_next().await {
        match answer.unwrap() {
            (s, false) if s.is_success() => ran += 1,
            (s, true) if s.is_success() => {}
            (StatusCode::CONFLICT, _) => {}
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert_eq!(ran, 1, "the backend's answer went to one client");
    assert_eq!(effects(b).await["/payments"], 1, "one effect");
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn each_worker_has_its_thread_and_socket_and_one_key_is_one_effect_across_them() {
    let b = backend(0).await;
    let g = gateway_with(&file(&b, "memory", ROUTES), &["--workers", "3"]).await;
    assert_eq!(listening_sockets(g.port), 3, "one socket per worker");
    // The main thread is the first worker; the others name themselves
    // once started, which may come after the gateway says it listens.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let names = threads(&g);
        let workers = names
            .iter()
            .filter(|n| n.starts_with("norepeat-worker"))
            .count();
        if workers == 2 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{names:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    one_key_one_effect(&[&g], &b).await;
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn work_stealing_serves_on_one_socket_with_the_same_guarantees() {
    let b = backend(0).await;
    let g = gateway_with(
        &file(&b, "memory", ROUTES),
        &["--work-stealing", "--workers", "2"],
    )
    .await;
    assert_eq!(listening_sockets(g.port), 1);
    assert!(
        !threads(&g).iter().any(|n| n.starts_with("norepeat-worker")),
        "no worker threads of ours"
    );
    one_key_one_effect(&[&g], &b).await;
}

/// On Redis, two workers of one gateway and a second gateway: one key is
/// one effect across all of them.
#[tokio::test]
async fn one_key_is_one_effect_across_workers_and_instances_on_redis() {
    let redis = RedisServer::start().await;
    let b = backend(0).await;
    let yaml = file(&b, &redis.url(), ROUTES);
    let g1 = gateway_with(&yaml, &["--workers", "2"]).await;
    let g2 = gateway_with(&yaml, &["--workers", "2"]).await;
    one_key_one_effect(&[&g1, &g2], &b).await;
}

/// On one Redis, each worker past the first calls the store over a
/// connection of its own, made on its thread once first called (before:
/// every worker went through the two connections made on the main thread,
/// and its answers woke that thread). 30 new connections, spread by the
/// kernel between 3 workers (the chance that one of them gets none is
/// under 1 in 50,000): the gateway holds 2 + 2 Redis connections.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn each_worker_calls_redis_over_a_connection_of_its_own() {
    let redis = RedisServer::start().await;
    let b = backend(0).await;
    let g = gateway_with(&file(&b, &redis.url(), ROUTES), &["--workers", "3"]).await;
    let mut con = redis.connection().await;
    let clients = |list: String| list.lines().filter(|l| !l.trim().is_empty()).count();
    let before: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut con)
        .await
        .unwrap();
    // The test's own connection and the gateway's first two.
    assert_eq!(clients(before), 1 + 2);
    for i in 0..30 {
        let res = Client::new()
            .post(url(&g, "/orders/quick"))
            .header("x-user-id", "u1")
            .body(format!("{{\"n\":{i}}}"))
            .send()
            .await
            .unwrap();
        assert!(res.status().is_success(), "{}", res.status());
    }
    // Each worker's own connection is made beside its first call: give
    // the last ones a moment.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let after = loop {
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(&mut con)
            .await
            .unwrap();
        let after = clients(list);
        if after >= 1 + 2 + 2 || tokio::time::Instant::now() > deadline {
            break after;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(after, 1 + 2 + 2, "one more per worker past the first");
}

/// A worker's own Redis connection is made beside its calls, not in
/// them: with new connections slow to reach Redis (400 ms, past the
/// 300 ms the longest store call waits), 30 payments on new client
/// connections, spread by the kernel over 2 workers, each succeed, a
/// worker's first among them over the first worker's connections. Before,
/// a worker's first call made its connection inside that call's time
/// budget: the payment that came first to the second worker was refused
/// (503, the route fails closed), as it was once on a loaded machine
/// with a fast Redis, whose calls get 50 ms.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_workers_first_call_does_not_wait_for_its_own_connection() {
    let redis = RedisServer::start().await;
    let proxy = norepeat_testkit::TcpProxy::start(redis.addr()).await;
    let b = backend(0).await;
    let g = gateway_with(
        &file(&b, &proxy.url_for_redis(), ROUTES),
        &["--workers", "2"],
    )
    .await;
    proxy.set_mode(norepeat_testkit::ProxyMode::DelayNew(
        Duration::from_millis(400),
    ));
    for i in 0..30 {
        let res = Client::new()
            .post(url(&g, "/payments"))
            .header("x-user-id", "u1")
            .header("idempotency-key", format!("first-calls-{i}"))
            .body("{}")
            .send()
            .await
            .unwrap();
        assert!(res.status().is_success(), "payment {i}: {}", res.status());
    }
    assert_eq!(effects(&b).await["/payments"], 30);
}

/// A second gateway started on the address a first one serves refuses to
/// start ("address in use"), as any server does, with a worker per core
/// (before: its `SO_REUSEPORT` sockets joined the first one's and the
/// kernel split new connections between the two processes).
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_second_gateway_on_the_same_address_refuses_to_start() {
    let b = backend(0).await;
    let yaml = file(&b, "memory", ROUTES);
    let first = gateway_with(&yaml, &["--workers", "2"]).await;
    let file = config_file(&yaml);
    let second = Command::new(env!("CARGO_BIN_EXE_norepeat-gateway"))
        .args(["--config", &file.to_string_lossy(), "--workers", "2"])
        .args(["--listen", &format!("127.0.0.1:{}", first.port)])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), second)
        .await
        .expect("the second gateway kept running on a port in use")
        .unwrap();
    let _ = std::fs::remove_file(file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.to_lowercase().contains("in use"), "{stderr}");
    assert_eq!(
        listening_sockets(first.port),
        2,
        "the first one's sockets only"
    );
}
