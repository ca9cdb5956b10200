// Over 400 lines on purpose: every store a URL can name, and its checking, in one match per operation.
//! A store chosen at run time.

use super::{
    KeyOp, KeyReply, KeyValueStore, MemoryStore, RateDecision, RateOp, RateStore, StoreError,
};

/// One of the built-in stores, chosen at run time: from a URL with
/// [`AnyStore::from_url`], or by wrapping one.
///
/// Dispatch is a `match`, not a boxed trait object, so no call allocates.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), norepeat::store::StoreError> {
/// use norepeat::store::{AnyStore, KeyValueStore};
/// let store = AnyStore::from_url(None).await?; // no URL: in memory
/// assert_eq!(store.kind(), "memory");
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum AnyStore {
    /// In process.
    Memory(MemoryStore),
    /// One Redis, or the master a set of Sentinels names.
    #[cfg(feature = "redis")]
    Redis(super::RedisStore),
    /// A Redis Cluster.
    #[cfg(feature = "redis")]
    Cluster(super::ClusterStore),
    /// A PostgreSQL table, with the reaper that reclaims its expired rows
    /// while the store lives (key-value operations only: rate limits are
    /// not kept in SQL).
    #[cfg(feature = "postgres")]
    Postgres(super::PgStore, std::sync::Arc<super::sql::Reaper>),
    /// A SQLite table (WAL), with its reaper, as for `Postgres`.
    #[cfg(feature = "sqlite")]
    Sqlite(super::SqliteStore, std::sync::Arc<super::sql::Reaper>),
}

/// How often an SQL store built from a URL reclaims its expired rows.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
const REAP_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

impl AnyStore {
    /// Whether the store keeps its data through a restart: a database
    /// does (`Some(true)`), the memory does not (`Some(false)`), a Redis
    /// does with AOF or RDB on ([`RedisStore::persistent`](super::RedisStore::persistent)).
    ///
    /// ```
    /// use norepeat::store::AnyStore;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), norepeat::store::StoreError> {
    /// let store = AnyStore::from_url(None).await?;
    /// assert_eq!(store.persistent().await?, Some(false));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The store does not answer.
    pub async fn persistent(&self) -> Result<Option<bool>, StoreError> {
        match self {
            AnyStore::Memory(_) => Ok(Some(false)),
            #[cfg(feature = "redis")]
            AnyStore::Redis(s) => s.persistent().await,
            #[cfg(feature = "redis")]
            AnyStore::Cluster(s) => s.persistent().await,
            #[cfg(feature = "postgres")]
            AnyStore::Postgres(..) => Ok(Some(true)),
            #[cfg(feature = "sqlite")]
            AnyStore::Sqlite(..) => Ok(Some(true)),
        }
    }

    /// `None`: a [`MemoryStore`] of 100,000 entries. `redis://...`: one Redis.
    /// `redis+sentinel://host:port,host:port/MASTER_NAME`: the master those
    /// Sentinels name, followed through failovers (see
    /// [`RedisStore`](super::RedisStore)). `redis+cluster://host:port,host:port`:
    /// a Redis Cluster. Each Redis URL may end with
    /// `?replicas=N&replicas_timeout=T`: every claim and completion then
    /// waits for `N` replicas to have it (see
    /// [`RedisStore`](super::RedisStore#replicas)). With the
    /// `postgres` feature, `postgres://...` (or `postgresql://`); with
    /// `sqlite`, `sqlite:FILE` (created if missing, in WAL mode): a table
    /// (`norepeat_keys`) created if it does not exist, its expired rows
    /// reclaimed every minute. An SQL store keeps keys only (the
    /// idempotency records a crash of the cache must not lose); a rate
    /// limit asked of it is an error.
    ///
    /// # Errors
    /// When the URL is not understood or the store cannot be reached.
    pub async fn from_url(url: Option<&str>) -> Result<Self, StoreError> {
        match url {
            None => Ok(Self::Memory(MemoryStore::default())),
            #[cfg(feature = "redis")]
            Some(u) if u.starts_with(CLUSTER_SCHEME) => Ok(Self::Cluster(
                super::ClusterStore::connect(&cluster_nodes(u)?).await?,
            )),
            #[cfg(feature = "redis")]
            Some(u)
                if u.starts_with("redis://")
                    || u.starts_with("rediss://")
                    || super::redis::url::is_sentinel(u) =>
            {
                Ok(Self::Redis(super::RedisStore::connect(u).await?))
            }
            #[cfg(feature = "postgres")]
            Some(u) if u.starts_with("postgres://") || u.starts_with("postgresql://") => {
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(16)
                    .acquire_timeout(std::time::Duration::from_secs(5))
                    .connect(u)
                    .await
                    .map_err(|e| {
                        StoreError::Connection(super::redact_url(&e.to_string()).into_owned())
                    })?;
                let store = super::PgStore::new(pool);
                store.migrate().await?;
                let reaper = std::sync::Arc::new(store.spawn_reaper(REAP_EVERY));
                Ok(Self::Postgres(store, reaper))
            }
            #[cfg(feature = "sqlite")]
            Some(u) if u.starts_with("sqlite:") => {
                use std::str::FromStr;
                let options = sqlx::sqlite::SqliteConnectOptions::from_str(u)
                    .map_err(|e| StoreError::InvalidUrl(format!("{u:?}: {e}")))?
                    .create_if_missing(true)
                    .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
                    .busy_timeout(std::time::Duration::from_secs(5));
                let pool = sqlx::sqlite::SqlitePoolOptions::new()
                    .max_connections(4)
                    .connect_with(options)
                    .await
                    .map_err(|e| StoreError::Connection(e.to_string()))?;
                let store = super::SqliteStore::new(pool);
                store.migrate().await?;
                let reaper = std::sync::Arc::new(store.spawn_reaper(REAP_EVERY));
                Ok(Self::Sqlite(store, reaper))
            }
            Some(u) => Err(StoreError::InvalidUrl(format!(
                "{:?}: expected redis://[[user]:password@]host:port[/db], rediss://..., redis+sentinel://host:port,host:port/MASTER_NAME or redis+cluster://host:port,host:port",
                super::redact_url(u)
            ))),
        }
    }
}

impl AnyStore {
    /// What [`from_url`](Self::from_url) would refuse in `url` before
    /// sending anything, found with nothing sent: a scheme it does not
    /// know, a Redis URL that does not parse, a query parameter it does
    /// not know (`replicas` and `replicas_timeout` are the store's own;
    /// `protocol` is passed on to redis-rs on one Redis). An SQL URL is
    /// checked when connected to. For a configuration check that must
    /// not wait on the store.
    ///
    /// ```
    /// use norepeat::store::AnyStore;
    /// assert!(AnyStore::check_url("redis://cache:6379/0?replicas=1&replicas_timeout=50ms").is_ok());
    /// assert!(AnyStore::check_url("redis+sentinel://s1:26379,s2:26379/mymaster").is_ok());
    /// let e = AnyStore::check_url("redis://cache:6379?replica=1").unwrap_err();
    /// assert!(e.to_string().contains("unknown query parameter \"replica\""));
    /// ```
    ///
    /// # Errors
    /// [`StoreError::InvalidUrl`], saying what is wrong and how a good URL
    /// looks (a password shown as `***`).
    pub fn check_url(url: &str) -> Result<(), StoreError> {
        match url {
            #[cfg(feature = "redis")]
            u if u.starts_with(CLUSTER_SCHEME) => cluster_nodes(u)?
                .iter()
                .try_for_each(|node| super::redis::check_url(node)),
            #[cfg(feature = "redis")]
            u if u.starts_with("redis://")
                || u.starts_with("rediss://")
                || super::redis::url::is_sentinel(u) =>
            {
                super::redis::check_url(u)
            }
            #[cfg(feature = "postgres")]
            u if u.starts_with("postgres://") || u.starts_with("postgresql://") => Ok(()),
            #[cfg(feature = "sqlite")]
            u if u.starts_with("sqlite:") => Ok(()),
            u => Err(StoreError::InvalidUrl(format!(
                "{:?}: expected redis://[[user]:password@]host:port[/db], rediss://..., redis+sentinel://host:port,host:port/MASTER_NAME or redis+cluster://host:port,host:port",
                super::redact_url(u)
            ))),
        }
    }
}

const CLUSTER_SCHEME: &str = "redis+cluster://";

/// `redis+cluster://[user:password@]host:port,host:port[/][?query]` as one
/// `redis://[user:password@]host:port[?query]` per node: the credentials,
/// written once before the first host, and the query (the store's
/// `replicas` settings, read by [`ClusterStore`](super::ClusterStore))
/// apply to every node.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
fn cluster_nodes(url: &str) -> Result<Vec<String>, StoreError> {
    let bad = |why: &str| {
        StoreError::InvalidUrl(format!(
            "{:?}: {why} (expected redis+cluster://[[user]:password@]host:port,host:port[?replicas=N&replicas_timeout=T])",
            super::redact_url(url)
        ))
    };
    let rest = url
        .strip_prefix(CLUSTER_SCHEME)
        .ok_or_else(|| bad("wrong scheme"))?;
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, format!("?{query}")),
        None => (rest, String::new()),
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains(['/', '#']) || query.contains('#') {
        return Err(bad("a path or database is not supported on a cluster"));
    }
    let (auth, hosts) = match rest.rsplit_once('@') {
        Some((auth, hosts)) => (format!("{auth}@"), hosts),
        None => (String::new(), rest),
    };
    let nodes: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| format!("redis://{auth}{h}{query}"))
        .collect();
    if nodes.is_empty() {
        return Err(bad("no node"));
    }
    Ok(nodes)
}

macro_rules! dispatch {
    ($self:ident, $s:ident => $e:expr) => {
        match $self {
            AnyStore::Memory($s) => $e,
            #[cfg(feature = "redis")]
            AnyStore::Redis($s) => $e,
            #[cfg(feature = "redis")]
            AnyStore::Cluster($s) => $e,
            #[cfg(feature = "postgres")]
            AnyStore::Postgres($s, _) => $e,
            #[cfg(feature = "sqlite")]
            AnyStore::Sqlite($s, _) => $e,
        }
    };
}

impl KeyValueStore for AnyStore {
    async fn execute(&self, op: KeyOp<'_>) -> Result<KeyReply, StoreError> {
        match self {
            AnyStore::Memory(s) => s.execute(op).await,
            #[cfg(feature = "redis")]
            AnyStore::Redis(s) => s.execute(op).await,
            #[cfg(feature = "redis")]
            AnyStore::Cluster(s) => s.execute(op).await,
            // Boxed: an SQL call's future (sqlx's) is large, and this one
            // is part of every claim in flight, on every store (see the
            // test below); a database call costs far more than the box.
            #[cfg(feature = "postgres")]
            AnyStore::Postgres(s, _) => Box::pin(s.execute(op)).await,
            #[cfg(feature = "sqlite")]
            AnyStore::Sqlite(s, _) => Box::pin(s.execute(op)).await,
        }
    }
    fn kind(&self) -> &'static str {
        dispatch!(self, s => s.kind())
    }
    fn reconnect(&self) {
        dispatch!(self, s => s.reconnect());
    }
    fn report_late_answers(&self, to: super::LateAnswers) {
        dispatch!(self, s => s.report_late_answers(to));
    }
}

impl RateStore for AnyStore {
    async fn rate(&self, op: RateOp<'_>) -> Result<RateDecision, StoreError> {
        match self {
            AnyStore::Memory(s) => s.rate(op).await,
            #[cfg(feature = "redis")]
            AnyStore::Redis(s) => s.rate(op).await,
            #[cfg(feature = "redis")]
            AnyStore::Cluster(s) => s.rate(op).await,
            #[cfg(feature = "postgres")]
            AnyStore::Postgres(..) => Err(not_for_rates("postgres")),
            #[cfg(feature = "sqlite")]
            AnyStore::Sqlite(..) => Err(not_for_rates("sqlite")),
        }
    }
}

/// A rate limit asked of an SQL store: it keeps keys only.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
fn not_for_rates(kind: &str) -> StoreError {
    StoreError::Protocol(format!(
        "a {kind} store keeps keys only: rate limits are kept in memory or Redis"
    ))
}

#[cfg(test)]
mod tests {
    use super::cluster_nodes;

    /// A claim's call on Redis carries no script's future (the scripts are
    /// boxed in `eval_bool`): through `AnyStore`, `put_if_absent`'s future
    /// is 496 bytes with the batching (416 before it; 744 with the scripts
    /// unboxed, measured before it), and it is part of every request in
    /// flight.
    #[cfg(feature = "redis")]
    #[tokio::test]
    async fn a_claim_on_redis_does_not_carry_a_scripts_future() {
        use crate::store::{AnyStore, KeyValueStoreExt, RedisStore};
        use std::time::Duration;
        let store = AnyStore::Redis(RedisStore::connect_lazy("redis://127.0.0.1:1").unwrap());
        let claim = store.put_if_absent("k", b"v", Duration::from_secs(1));
        let size = std::mem::size_of_val(&claim);
        assert!(size <= 512, "put_if_absent's future is {size} bytes");
    }

    /// A URL that is not one is said to be invalid, with how a good one
    /// looks, and a password never shows in an error. Before: "unexpected
    /// answer from store" for a URL without a scheme (nothing was sent),
    /// and a cluster URL's password in the error as written.
    #[cfg(feature = "redis")]
    #[tokio::test]
    async fn a_bad_url_is_called_invalid_and_its_password_is_hidden() {
        use crate::store::{AnyStore, RedisStore, StoreError};
        let Err(StoreError::InvalidUrl(e)) = RedisStore::connect("127.0.0.1:6379").await else {
            panic!("a URL without a scheme is invalid");
        };
        assert!(
            e.contains("127.0.0.1:6379") && e.contains("redis://"),
            "{e}"
        );
        assert!(matches!(
            RedisStore::connect_lazy("127.0.0.1:6379"),
            Err(StoreError::InvalidUrl(_))
        ));
        for url in [
            "redis+cluster://u:hunter2@/",
            "memcached://u:hunter2@cache:11211",
            "redis://:hunter2@127.0.0.1:1",
        ] {
            let e = AnyStore::from_url(Some(url))
                .await
                .expect_err("no store there")
                .to_string();
            assert!(!e.contains("hunter2") && e.contains("***"), "{url}: {e}");
        }
        assert!(matches!(
            AnyStore::from_url(Some("memcached://cache:11211")).await,
            Err(StoreError::InvalidUrl(_))
        ));
    }

    #[test]
    fn urls_lose_their_passwords() {
        use crate::store::redact_url;
        for (url, shown) in [
            ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
            ("rediss://user:pw@h:6379", "rediss://user:***@h:6379"),
            (
                "redis+cluster://u:p%40ss@h1:7000,h2:7000/",
                "redis+cluster://u:***@h1:7000,h2:7000/",
            ),
            (
                "postgres://shop:pw@db:5432/shop?sslmode=require",
                "postgres://shop:***@db:5432/shop?sslmode=require",
            ),
            (
                "postgres://db/shop?user=u&password=pw&x=1",
                "postgres://db/shop?user=u&password=***&x=1",
            ),
            (
                "postgres://a:pw@db/shop?password=pw",
                "postgres://a:***@db/shop?password=***",
            ),
            ("sqlite://shop.db?mode=rwc", "sqlite://shop.db?mode=rwc"),
            ("redis://user@h:6379", "redis://user@h:6379"),
            ("127.0.0.1:6379", "127.0.0.1:6379"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn cluster_urls_become_one_url_per_node() {
        assert_eq!(
            cluster_nodes("redis+cluster://10.0.0.1:7000, 10.0.0.2:7001,").unwrap(),
            ["redis://10.0.0.1:7000", "redis://10.0.0.2:7001"]
        );
        assert_eq!(
            cluster_nodes("redis+cluster://u:p%40ss@h1:7000,h2:7000/").unwrap(),
            ["redis://u:p%40ss@h1:7000", "redis://u:p%40ss@h2:7000"]
        );
        assert_eq!(
            cluster_nodes("redis+cluster://h1:7000,h2:7000/?replicas=1").unwrap(),
            ["redis://h1:7000?replicas=1", "redis://h2:7000?replicas=1"]
        );
        for bad in [
            "redis+cluster://",
            "redis+cluster://,",
            "redis+cluster://h:1/0",
            "redis+cluster://h:1#x",
            "redis://h:1",
        ] {
            assert!(cluster_nodes(bad).is_err(), "{bad}");
        }
    }
}
