//! A fresh database on each SQL backend: a SQLite file or a PostgreSQL
//! database.

use std::path::PathBuf;

use sqlx::{Encode, Postgres, Sqlite, Type};

use crate::pg::PgDatabase;
use crate::util::TempDir;

/// A new, empty database, removed when dropped: a SQLite file in a private
/// temporary directory, or a [`PgDatabase`].
///
/// [`each`](Self::each) gives one of each, so a test runs the same scenario
/// on both backends:
///
/// ```no_run
/// use norepeat_testkit::TestDb;
///
/// # async fn demo() {
/// for db in TestDb::each().await {
///     // Start the code under test on `db.url()`, then read what it wrote.
///     let url = db.url();
///     assert!(url.starts_with("sqlite:") || url.starts_with("postgres:"));
///     let one = db.scalar::<&str>("SELECT CAST(1 AS BIGINT)", []).await;
///     assert_eq!(one, 1);
/// }
/// # }
/// ```
#[derive(Debug)]
pub enum TestDb {
    /// `shop.db` in a temporary directory (removed with its `-wal`/`-shm`
    /// files on drop).
    Sqlite(SqliteFile),
    /// A fresh PostgreSQL database (dropped on drop).
    Postgres(PgDatabase),
}

/// A SQLite database file that does not exist yet, in a directory removed
/// on drop.
#[derive(Debug)]
pub struct SqliteFile {
    dir: TempDir,
}

impl SqliteFile {
    /// A path in a new temporary directory.
    ///
    /// # Panics
    ///
    /// Panics when the directory cannot be created.
    pub fn new() -> SqliteFile {
        SqliteFile {
            dir: TempDir::new("nr-sqlite"),
        }
    }

    /// The file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.path().join("shop.db")
    }

    /// `sqlite://PATH?mode=rwc`: creates the file on first connection.
    pub fn url(&self) -> String {
        format!("sqlite://{}?mode=rwc", self.path().display())
    }
}

impl Default for SqliteFile {
    fn default() -> Self {
        Self::new()
    }
}

impl TestDb {
    /// A SQLite file and a fresh PostgreSQL database, in that order.
    ///
    /// # Panics
    ///
    /// Panics when PostgreSQL cannot be reached (see [`PgDatabase::fresh`]).
    pub async fn each() -> [TestDb; 2] {
        [TestDb::sqlite(), TestDb::postgres().await]
    }

    /// A SQLite file in a new temporary directory.
    pub fn sqlite() -> TestDb {
        TestDb::Sqlite(SqliteFile::new())
    }

    /// A fresh PostgreSQL database.
    ///
    /// # Panics
    ///
    /// Panics when PostgreSQL cannot be reached (see [`PgDatabase::fresh`]).
    pub async fn postgres() -> TestDb {
        TestDb::Postgres(PgDatabase::fresh().await)
    }

    /// The connection URL: `sqlite://PATH?mode=rwc` or `postgres://...`.
    pub fn url(&self) -> String {
        match self {
            TestDb::Sqlite(file) => file.url(),
            TestDb::Postgres(pg) => pg.url(),
        }
    }

    /// `"sqlite"` or `"postgres"`.
    pub fn backend(&self) -> &'static str {
        match self {
            TestDb::Sqlite(_) => "sqlite",
            TestDb::Postgres(_) => "postgres",
        }
    }

    /// One `BIGINT` read with `sql` (placeholders `$1`, `$2`, ..., which
    /// both backends accept), binding `args` in order, over a connection
    /// opened and closed for the query.
    ///
    /// # Panics
    ///
    /// Panics when the database cannot be reached or the query fails.
    pub async fn scalar<A>(&self, sql: &str, args: impl IntoIterator<Item = A>) -> i64
    where
        A: for<'q> Encode<'q, Sqlite>
            + Type<Sqlite>
            + for<'q> Encode<'q, Postgres>
            + Type<Postgres>
            + Send,
    {
        let failed =
            |e: sqlx::Error| -> i64 { panic!("norepeat-testkit: {sql} on {}: {e}", self.url()) };
        match self {
            TestDb::Sqlite(file) => {
                let pool = sqlx::SqlitePool::connect(&file.url())
                    .await
                    .unwrap_or_else(|e| {
                        panic!("norepeat-testkit: cannot open {}: {e}", file.url())
                    });
                let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()));
                for a in args {
                    query = query.bind(a);
                }
                let n = query.fetch_one(&pool).await.unwrap_or_else(failed);
                pool.close().await;
                n
            }
            TestDb::Postgres(pg) => {
                let pool = pg.pool().await;
                let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()));
                for a in args {
                    query = query.bind(a);
                }
                let n = query.fetch_one(&pool).await.unwrap_or_else(failed);
                pool.close().await;
                n
            }
        }
    }
}
