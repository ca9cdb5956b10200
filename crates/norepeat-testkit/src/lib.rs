//! Real services for norepeat's tests.
//!
//! Everything here starts genuine processes or connections — no mocks:
//!
//! * [`RedisServer`]: a private `redis-server` on a free loopback port, killed on drop.
//! * [`RedisCluster`]: a 6-node (3 masters, 3 replicas) Redis Cluster, with failover helpers.
//! * [`RedisSentinels`]: a master, two replicas and three Sentinels, with failover helpers.
//! * [`PgDatabase`]: a freshly created PostgreSQL database, dropped on drop.
//! * [`TestDb`]: a fresh SQLite file or PostgreSQL database ([`TestDb::each`]: one of each).
//! * [`TcpProxy`]: a fault-injecting TCP proxy (pass, delay, slow handshakes, swallow, refuse).
//! * [`ShopProcess`]: a built `serve` binary started on a free port.
//! * [`GatewayProcess`]: a `norepeat-gateway` on a file of its own ([`gateway_binary`] finds it).
//! * [`send`]: one request through a tower service (an axum `Router`), its [`Answer`] read whole;
//!   [`post_with_token`]: a token-guarded request to send.
//! * [`SqlBackend`]: [`PgDatabase`] or [`SqliteFile`] as a type, fresh and pooled alike, for tests stamped once per SQL backend.
//! * [`Recorded`]: a metrics recorder that keeps the counters and the names the code under test recorded.
//! * [`Tomcat`]: a private Tomcat 10 with a servlet that counts payments, on a default and a lenient connector.
//! * [`free_port`]: a currently free loopback TCP port.
//!
//! Helpers in this crate panic with a descriptive message when the test
//! environment is broken (no `redis-server` binary, PostgreSQL unreachable, …):
//! a test that cannot get its services cannot meaningfully continue.
//!
//! ```no_run
//! use norepeat_testkit::{ProxyMode, RedisServer, TcpProxy};
//! use std::time::Duration;
//!
//! # async fn demo() {
//! let redis = RedisServer::start().await;
//! let proxy = TcpProxy::start(redis.addr()).await;
//! proxy.set_mode(ProxyMode::Delay(Duration::from_millis(300)));
//! let client = redis::Client::open(proxy.url_for_redis()).expect("valid url");
//! # }
//! ```

mod cluster;
mod db;
mod gateway;
mod http;
mod metrics;
mod pg;
mod proxy;
mod redis_server;
mod sentinel;
mod shop;
mod sql;
mod tomcat;
mod util;

pub use cluster::RedisCluster;
pub use db::{SqliteFile, TestDb};
pub use gateway::{GATEWAY_BIN_ENV, GatewayProcess, gateway_binary};
// `self::`: the module shares its name with the `http` crate.
pub use self::http::{Answer, TOKEN_HEADER, USER_HEADER, post_with_token, send, send_until_break};
// `self::`: the module shares its name with the `metrics` crate.
pub use self::metrics::{Labels, Recorded};
pub use pg::{DEFAULT_PG_ADMIN_URL, PG_ADMIN_URL_ENV, PgDatabase};
pub use proxy::{ProxyMode, TcpProxy};
pub use redis_server::RedisServer;
pub use sentinel::{MASTER_NAME as SENTINEL_MASTER_NAME, RedisSentinels};
pub use shop::{CALLBACK_SECRET_ENV, KEPT_ENV, ShopProcess, sign_callback, sign_callback_now};
pub use sql::SqlBackend;
pub use tomcat::{TOMCAT_HOME_ENV, Tomcat, TomcatConnector};
pub use util::free_port;
