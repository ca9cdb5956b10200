// Over 400 lines: each process the kit starts, tested once, sharing its waits.
//! Tests of the test kit itself, against real processes and databases.

use std::time::{Duration, Instant};

use norepeat_testkit::{PgDatabase, ProxyMode, RedisCluster, RedisServer, TcpProxy, free_port};

/// A multiplexed connection with generous timeouts (the proxy tests delay replies).
async fn connect(url: &str) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(url)?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_response_timeout(Some(Duration::from_secs(10)));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

async fn ping(con: &mut redis::aio::MultiplexedConnection) -> redis::RedisResult<String> {
    redis::cmd("PING").query_async::<String>(con).await
}

#[test]
fn free_port_is_bindable() {
    let port = free_port();
    assert_ne!(port, 0);
    std::net::TcpListener::bind(("127.0.0.1", port)).expect("free port can be bound");
}

#[tokio::test]
async fn redis_starts_answers_kill_and_restart() {
    let mut redis = RedisServer::start().await;
    assert!(redis.is_running());
    assert_eq!(redis.url(), format!("redis://127.0.0.1:{}", redis.port()));
    let port = redis.port();

    let mut con = connect(&redis.url()).await.expect("connect");
    assert_eq!(ping(&mut con).await.expect("ping"), "PONG");
    redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query_async::<()>(&mut con)
        .await
        .expect("set");
    assert_eq!(redis.dbsize().await, 1);

    redis.kill();
    assert!(!redis.is_running());
    assert!(
        connect(&redis.url()).await.is_err(),
        "a killed server must refuse connections"
    );

    redis.restart().await;
    assert!(redis.is_running());
    assert_eq!(redis.port(), port, "restart keeps the port");
    assert_eq!(redis.dbsize().await, 0, "restart starts empty");
    let mut con = connect(&redis.url()).await.expect("reconnect");
    assert_eq!(ping(&mut con).await.expect("ping"), "PONG");
}

#[tokio::test]
async fn redis_keys_without_ttl_and_config_set() {
    let redis = RedisServer::start().await;
    let mut con = redis.connection().await;
    redis::cmd("SET")
        .arg("forever")
        .arg("1")
        .query_async::<()>(&mut con)
        .await
        .expect("set forever");
    redis::cmd("SET")
        .arg("mortal")
        .arg("1")
        .arg("PX")
        .arg(60_000)
        .query_async::<()>(&mut con)
        .await
        .expect("set mortal");
    for i in 0..2500 {
        redis::cmd("SET")
            .arg(format!("bulk:{i}"))
            .arg(i)
            .arg("EX")
            .arg(600)
            .query_async::<()>(&mut con)
            .await
            .expect("set bulk");
    }
    assert_eq!(redis.keys_without_ttl().await, vec!["forever".to_owned()]);
    assert_eq!(redis.dbsize().await, 2502);

    redis.config_set("maxmemory", "1").await;
    let err = redis::cmd("SET")
        .arg("x")
        .arg("y")
        .query_async::<()>(&mut con)
        .await
        .expect_err("writes fail once maxmemory is exceeded");
    assert!(err.to_string().contains("OOM"), "unexpected error: {err}");
}

#[tokio::test]
async fn redis_drop_kills_process() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    drop(redis);
    assert!(connect(&url).await.is_err(), "dropped server is gone");
}

#[tokio::test]
async fn proxy_pass_and_delay() {
    let redis = RedisServer::start().await;
    let proxy = TcpProxy::start(redis.addr()).await;
    assert_eq!(proxy.mode(), ProxyMode::Pass);
    assert_eq!(
        proxy.url_for_redis(),
        format!("redis://127.0.0.1:{}", proxy.addr().port())
    );

    let mut con = connect(&proxy.url_for_redis())
        .await
        .expect("connect via proxy");
    assert_eq!(ping(&mut con).await.expect("ping via proxy"), "PONG");

    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(300)));
    let started = Instant::now();
    assert_eq!(ping(&mut con).await.expect("delayed ping"), "PONG");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "delayed ping took only {:?}",
        started.elapsed()
    );

    proxy.set_mode(ProxyMode::Pass);
    assert_eq!(ping(&mut con).await.expect("ping after delay"), "PONG");
    assert!(proxy.accepted_connections() >= 1);
}

#[tokio::test]
async fn proxy_delay_new_slows_only_the_connections_made_then() {
    let redis = RedisServer::start().await;
    let proxy = TcpProxy::start(redis.addr()).await;
    let mut old = connect(&proxy.url_for_redis()).await.expect("connect");
    proxy.set_mode(ProxyMode::DelayNew(Duration::from_millis(500)));
    let started = Instant::now();
    let mut new = connect(&proxy.url_for_redis()).await.expect("connect");
    assert_eq!(ping(&mut new).await.expect("ping"), "PONG");
    let handshake = started.elapsed();
    assert!(handshake >= Duration::from_millis(500), "{handshake:?}");
    let started = Instant::now();
    assert_eq!(ping(&mut old).await.expect("ping"), "PONG");
    assert_eq!(ping(&mut new).await.expect("ping"), "PONG");
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "made connections pass: {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn proxy_swallow_hangs_existing_and_new_connections() {
    let redis = RedisServer::start().await;
    let proxy = TcpProxy::start(redis.addr()).await;
    let mut con = connect(&proxy.url_for_redis()).await.expect("connect");
    assert_eq!(ping(&mut con).await.expect("ping"), "PONG");

    proxy.set_mode(ProxyMode::Swallow);
    let hung = tokio::time::timeout(Duration::from_millis(500), ping(&mut con)).await;
    assert!(hung.is_err(), "existing connection must hang, got {hung:?}");

    // A new connection is accepted but the handshake never completes.
    let client = redis::Client::open(proxy.url_for_redis()).expect("url");
    let fresh = tokio::time::timeout(
        Duration::from_millis(500),
        client.get_multiplexed_async_connection_with_config(
            &redis::AsyncConnectionConfig::new()
                .set_connection_timeout(None)
                .set_response_timeout(None),
        ),
    )
    .await;
    assert!(fresh.is_err(), "new connection must hang too");

    // Healthy again: a new connection works.
    proxy.set_mode(ProxyMode::Pass);
    let mut con = connect(&proxy.url_for_redis()).await.expect("reconnect");
    assert_eq!(ping(&mut con).await.expect("ping"), "PONG");
}

#[tokio::test]
async fn proxy_refuse_closes_connections() {
    let redis = RedisServer::start().await;
    let proxy = TcpProxy::start(redis.addr()).await;
    let mut con = connect(&proxy.url_for_redis()).await.expect("connect");
    assert_eq!(ping(&mut con).await.expect("ping"), "PONG");

    proxy.set_mode(ProxyMode::Refuse);
    let existing = tokio::time::timeout(Duration::from_secs(5), ping(&mut con))
        .await
        .expect("refused connection fails fast rather than hanging");
    assert!(existing.is_err(), "existing connection must fail");

    let fresh = tokio::time::timeout(Duration::from_secs(5), connect(&proxy.url_for_redis()))
        .await
        .expect("refused connect fails fast rather than hanging");
    assert!(fresh.is_err(), "new connection must fail");

    proxy.set_mode(ProxyMode::Pass);
    let mut con = connect(&proxy.url_for_redis()).await.expect("reconnect");
    assert_eq!(ping(&mut con).await.expect("ping"), "PONG");
}

#[tokio::test]
async fn proxy_drop_stops_listening() {
    let redis = RedisServer::start().await;
    let proxy = TcpProxy::start(redis.addr()).await;
    let addr = proxy.addr();
    let mut con = connect(&proxy.url_for_redis()).await.expect("connect");
    assert_eq!(ping(&mut con).await.expect("ping"), "PONG");
    drop(proxy);
    // Give the aborted tasks a moment to release the listener and connections.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "listener is closed after drop"
    );
    let res = tokio::time::timeout(Duration::from_secs(5), ping(&mut con))
        .await
        .expect("existing connection is closed, not hanging");
    assert!(res.is_err());
}

#[tokio::test]
async fn pg_fresh_database_is_usable_and_dropped() {
    let db = PgDatabase::fresh().await;
    let name = db.name().to_owned();
    assert!(name.starts_with("nr_test_"));
    assert!(db.url().ends_with(&format!("/{name}")));
    assert!(PgDatabase::exists(&name).await);

    let pool = db.pool().await;
    sqlx::query("CREATE TABLE t (id int primary key)")
        .execute(&pool)
        .await
        .expect("create table");
    sqlx::query("INSERT INTO t VALUES (1), (2)")
        .execute(&pool)
        .await
        .expect("insert");
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM t")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(count, 2);

    // Dropping with the pool still open: WITH (FORCE) disconnects it.
    drop(db);
    assert!(
        !PgDatabase::exists(&name).await,
        "database {name} was dropped"
    );
    pool.close().await;
}

#[tokio::test]
async fn pg_drop_now() {
    let db = PgDatabase::fresh().await;
    let name = db.name().to_owned();
    assert!(PgDatabase::exists(&name).await);
    db.drop_now().await;
    assert!(!PgDatabase::exists(&name).await);
}

#[tokio::test]
async fn cluster_starts_and_fails_over() {
    let mut cluster = RedisCluster::start().await;
    assert_eq!(cluster.node_urls().len(), 6);
    assert!(cluster.url().starts_with("redis+cluster://127.0.0.1:"));
    assert_eq!(cluster.url().matches("127.0.0.1:").count(), 6);

    let masters = cluster.masters().await;
    assert_eq!(masters.len(), 3, "masters: {masters:?}");
    let per_master = cluster.keys_per_master().await;
    assert_eq!(per_master.len(), 3);
    assert!(per_master.iter().all(|&(_, n)| n == 0));

    let killed = cluster.kill_master(0).await;
    assert_eq!(killed, masters[0]);
    cluster.wait_for_failover().await;

    let after = cluster.masters().await;
    assert_eq!(after.len(), 3, "masters after failover: {after:?}");
    assert!(
        !after.contains(&killed),
        "killed master {killed} still listed"
    );
    assert_eq!(cluster.keys_per_master().await.len(), 3);
}

/// Writes an executable shell script standing in for a server binary.
fn fake_server(name: &str, body: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = std::env::temp_dir().join(format!(
        "norepeat-testkit-fake-{}-{name}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("create script dir");
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

#[tokio::test]
async fn shop_process_reads_listening_line_and_kills() {
    let bin = fake_server(
        "listening",
        r#"echo "args: $*"
echo "greeting: $SHOP_GREETING" >&2
[ "$1 $2 $3" = "serve --listen 127.0.0.1:0" ] || exit 3
echo "INFO shop: listening on http://127.0.0.1:4242"
exec sleep 600"#,
    );
    let mut shop = norepeat_testkit::ShopProcess::start(
        &bin,
        vec![("SHOP_GREETING".to_owned(), "hi".to_owned())],
    )
    .await;
    assert_eq!(shop.base_url(), "http://127.0.0.1:4242");
    assert!(shop.is_running());
    assert!(shop.pid().is_some());
    shop.kill();
    assert!(!shop.is_running());
    drop(shop);
    let _ = std::fs::remove_dir_all(bin.parent().expect("script dir"));
}

#[tokio::test]
async fn shop_process_panics_when_binary_exits_early() {
    let bin = fake_server("exits", "echo 'boom' >&2\nexit 1");
    let path = bin.clone();
    let outcome = tokio::spawn(async move {
        norepeat_testkit::ShopProcess::start(&path, Vec::new()).await;
    })
    .await;
    let _ = std::fs::remove_dir_all(bin.parent().expect("script dir"));
    let err = outcome.expect_err("start must panic when the binary exits early");
    assert!(err.is_panic());
    let payload = err.into_panic();
    let msg = payload
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(
        msg.contains("closed stdout before printing"),
        "panic: {msg}"
    );
}

/// A started binary sees only what the test gives it (and `KEPT_ENV`):
/// nothing else of the test's own environment leaks in, so a developer's
/// `REDIS_URL` cannot change what an "embedded defaults" test checks.
#[tokio::test]
async fn a_started_binary_gets_a_cleared_environment() {
    use std::os::unix::fs::PermissionsExt as _;
    // A variable the test process certainly has: cargo and nextest both set
    // CARGO_MANIFEST_DIR for the tests they run.
    let leaked = "CARGO_MANIFEST_DIR";
    assert!(
        std::env::var_os(leaked).is_some(),
        "the test runner sets {leaked}"
    );
    let dir = std::env::temp_dir().join(format!("norepeat-kit-env-{}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let dump = dir.join("env.txt");
    let bin = dir.join("fake-shop");
    std::fs::write(
        &bin,
        format!(
            "#!/bin/sh\nenv > '{}'\necho 'listening on http://127.0.0.1:9'\nexec sleep 30\n",
            dump.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let shop = norepeat_testkit::ShopProcess::start(
        &bin,
        vec![("NOREPEAT_GIVEN".to_owned(), "yes".to_owned())],
    )
    .await;
    assert_eq!(shop.base_url(), "http://127.0.0.1:9");
    let env = std::fs::read_to_string(&dump).unwrap();
    drop(shop);
    let _ = std::fs::remove_dir_all(&dir);
    let names: Vec<&str> = env.lines().filter_map(|l| l.split('=').next()).collect();
    assert!(env.lines().any(|l| l == "NOREPEAT_GIVEN=yes"), "{env}");
    assert!(names.contains(&"PATH"), "PATH is kept: {env}");
    assert!(!names.contains(&leaked), "{leaked} leaked in: {env}");
    for name in &names {
        assert!(
            *name == "NOREPEAT_GIVEN"
                || norepeat_testkit::KEPT_ENV.contains(name)
                // What sh itself sets.
                || ["PWD", "SHLVL", "_", "OLDPWD"].contains(name),
            "{name} leaked in: {env}"
        );
    }
}
