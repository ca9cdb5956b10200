//! `persistent()`: whether a real Redis keeps its data through a restart,
//! read from the server as the operator set it.

use norepeat::store::{AnyStore, RedisStore};
use norepeat_testkit::RedisServer;

#[tokio::test]
async fn a_redis_without_aof_or_rdb_says_it_forgets() {
    let redis = RedisServer::start().await;
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    // The kit's server: `--save "" --appendonly no`.
    assert_eq!(store.persistent().await.unwrap(), Some(false));
    redis.config_set("save", "3600 1").await;
    assert_eq!(store.persistent().await.unwrap(), Some(true));
    redis.config_set("save", "").await;
    redis.config_set("appendonly", "yes").await;
    assert_eq!(store.persistent().await.unwrap(), Some(true));
    let any = AnyStore::from_url(Some(&redis.url())).await.unwrap();
    assert_eq!(any.persistent().await.unwrap(), Some(true));
}
