//! Opening the database: the URL's backend, the pool's settings, the
//! embedded migrations (raced safely by processes starting together) and
//! the seed stock.

use std::str::FromStr;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use super::backend::Queries;
use super::{DEFAULT_SQLITE_FILE, Db, DbError, SEED_STOCK, retry};

/// How long a SQLite connection waits for a lock before `SQLITE_BUSY`.
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections per pool for a SQLite file (writers are serialised by SQLite anyway).
const SQLITE_POOL_SIZE: u32 = 8;
/// Connections per pool for PostgreSQL.
const PG_POOL_SIZE: u32 = 10;
/// Longest wait for a pooled connection.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts to migrate a SQLite database another process may be migrating too.
const SQLITE_MIGRATE_ATTEMPTS: u32 = 20;

static SQLITE_MIGRATOR: Migrator = sqlx::migrate!("./migrations/sqlite");
static POSTGRES_MIGRATOR: Migrator = sqlx::migrate!("./migrations/postgres");

impl Db {
    /// Connects, migrates and seeds.
    ///
    /// `url`: `None` means the SQLite file [`DEFAULT_SQLITE_FILE`] in the working
    /// directory (created if missing). Otherwise `sqlite://PATH?mode=rwc`,
    /// `sqlite::memory:` (one connection, kept open for the pool's life) or
    /// `postgres://...` / `postgresql://...`.
    ///
    /// The embedded migrations are applied (on PostgreSQL under sqlx's advisory
    /// lock; on SQLite retried while another process holds the write lock), then
    /// `SKU-1`..`SKU-3` are stocked with 100 units each if absent. SQLite runs in
    /// WAL mode with a 5 s busy timeout and foreign keys on. Safe to call from
    /// two processes at once on the same database.
    pub async fn connect(url: Option<&str>) -> Result<Db, DbError> {
        let db = match url {
            None => {
                let opts = SqliteConnectOptions::new()
                    .filename(DEFAULT_SQLITE_FILE)
                    .create_if_missing(true);
                Self::connect_sqlite(opts, false).await?
            }
            Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                Self::connect_postgres(url).await?
            }
            Some(url) if url.starts_with("sqlite:") => {
                let memory = url.contains(":memory:") || url.contains("mode=memory");
                let opts = SqliteConnectOptions::from_str(url)?;
                Self::connect_sqlite(opts, memory).await?
            }
            Some(other) => {
                let scheme = other.split(':').next().unwrap_or_default();
                return Err(DbError::InvalidInput(format!(
                    "unsupported database URL scheme {scheme:?} (expected sqlite: or postgres:)"
                )));
            }
        };
        dispatch!(&db, q => q.seed(&SEED_STOCK).await)?;
        Ok(db)
    }

    async fn connect_postgres(url: &str) -> Result<Db, DbError> {
        let pool = PgPoolOptions::new()
            .max_connections(PG_POOL_SIZE)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect(url)
            .await?;
        // sqlx takes a session advisory lock around the run, so concurrent
        // starters apply each migration exactly once.
        POSTGRES_MIGRATOR.run(&pool).await?;
        Ok(Db::Postgres(pool))
    }

    async fn connect_sqlite(opts: SqliteConnectOptions, memory: bool) -> Result<Db, DbError> {
        let mut opts = opts.busy_timeout(SQLITE_BUSY_TIMEOUT).foreign_keys(true);
        let pool_opts = if memory {
            // Every connection to `sqlite::memory:` shares one database only
            // while one connection stays open; a single, never-recycled
            // connection also avoids shared-cache table locks.
            SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
        } else {
            opts = opts
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal);
            SqlitePoolOptions::new().max_connections(SQLITE_POOL_SIZE)
        };
        let pool_opts = pool_opts.acquire_timeout(ACQUIRE_TIMEOUT);
        // Switching a fresh file to WAL needs an exclusive lock that the busy
        // timeout does not cover: retry when another process is doing the same.
        let pool =
            retry::retry(|| async { Ok(pool_opts.clone().connect_with(opts.clone()).await?) })
                .await?;
        // SQLite has no migration lock: if another process migrates the same
        // file at once, one of us fails (busy, or the version row already
        // exists); trying again sees the migration applied.
        let mut attempt = 1;
        loop {
            match SQLITE_MIGRATOR.run(&pool).await {
                Ok(()) => break,
                Err(
                    e @ (sqlx::migrate::MigrateError::Execute(_)
                    | sqlx::migrate::MigrateError::ExecuteMigration(..)),
                ) if attempt < SQLITE_MIGRATE_ATTEMPTS => {
                    tracing::debug!(attempt, error = %e, "sqlite migration raced, retrying");
                    tokio::time::sleep(Duration::from_millis(20 * u64::from(attempt))).await;
                    attempt += 1;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Db::Sqlite(pool))
    }
}
