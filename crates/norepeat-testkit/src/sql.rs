//! One SQL backend behind one trait, for tests stamped once per backend.

use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use crate::db::SqliteFile;
use crate::pg::PgDatabase;

/// A fresh database of one SQL backend and the pools a test opens on it:
/// a test written once as a macro takes the backend as a type
/// ([`PgDatabase`] or [`SqliteFile`]) and stamps its cases for each.
///
/// ```no_run
/// use norepeat_testkit::{PgDatabase, SqlBackend, SqliteFile};
///
/// /// A fresh database of backend `B` (kept alive by the caller), and a
/// /// pool on it.
/// async fn open<B: SqlBackend>() -> (B, sqlx::Pool<B::Database>) {
///     let db = B::fresh().await;
///     let pool = B::pool(&db.url()).await;
///     (db, pool)
/// }
///
/// # async fn demo() {
/// let (_pg, pool) = open::<PgDatabase>().await;
/// sqlx::query("SELECT 1").execute(&pool).await.unwrap();
/// let (_file, pool) = open::<SqliteFile>().await;
/// sqlx::query("SELECT 1").execute(&pool).await.unwrap();
/// # }
/// ```
pub trait SqlBackend: Sized + Send + Sync + 'static {
    /// The sqlx database.
    type Database: sqlx::Database;

    /// A new, empty database, removed when the value is dropped.
    fn fresh() -> impl Future<Output = Self> + Send;

    /// Where to connect: a URL for [`pool`](Self::pool).
    fn url(&self) -> String;

    /// [`fresh`](Self::fresh), and its [`url`](Self::url): a test keeps the
    /// database (its guard) and hands the URL to what it tests.
    fn fresh_with_url() -> impl Future<Output = (String, Self)> + Send {
        async {
            let db = Self::fresh().await;
            (db.url(), db)
        }
    }

    /// A new pool on the database at `url` (this backend's), as the tests
    /// use it: PostgreSQL up to 8 connections; SQLite up to 4, in WAL mode
    /// with a 30 s busy timeout (several writers wait for each other rather
    /// than fail), the file created when missing.
    ///
    /// # Panics
    ///
    /// Panics when the database cannot be reached.
    fn pool(url: &str) -> impl Future<Output = sqlx::Pool<Self::Database>> + Send;
}

impl SqlBackend for PgDatabase {
    type Database = sqlx::Postgres;

    async fn fresh() -> Self {
        PgDatabase::fresh().await
    }

    fn url(&self) -> String {
        PgDatabase::url(self)
    }

    async fn pool(url: &str) -> sqlx::PgPool {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .connect(url)
            .await
            .unwrap_or_else(|e| panic!("norepeat-testkit: cannot connect to {url}: {e}"))
    }
}

impl SqlBackend for SqliteFile {
    type Database = sqlx::Sqlite;

    async fn fresh() -> Self {
        SqliteFile::new()
    }

    fn url(&self) -> String {
        SqliteFile::url(self)
    }

    async fn pool(url: &str) -> sqlx::SqlitePool {
        use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
        let options = SqliteConnectOptions::from_str(url)
            .unwrap_or_else(|e| panic!("norepeat-testkit: not a SQLite URL {url}: {e}"))
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(30));
        SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .unwrap_or_else(|e| panic!("norepeat-testkit: cannot open {url}: {e}"))
    }
}
