//! The `Idempotency-Key` rows on a SQL store (`--database URL`,
//! `--sql-rows`): `idempotency.cycle` and `idempotency.replay` through the
//! same [`IdempotencyLayer`](norepeat::idempotency::IdempotencyLayer) as on
//! Redis, with the records in a [`PgStore`] or a [`SqliteStore`] table.
//!
//! Each run migrates a table of its own (`norepeat_bench_<run>`), so runs
//! never see each other's rows, and drops it at the end. The pools are
//! sized as the shop's: 10 connections on PostgreSQL; 8 on SQLite, in WAL
//! mode with `synchronous = NORMAL` and a 5 s busy timeout.
//!
//! As on Redis, `replay` sends every request with one key. On SQL that is
//! a write too: the store's `put_if_absent` rewrites the live row it meets
//! (see `norepeat::store::sql`), so the replays of one key queue on that
//! row's lock (on SQLite, on the database's write lock).

use super::super::error::BenchError;
use super::super::harness::{Load, Sample};
use super::idempotency::{cycle_on, replay_on};
use norepeat::store::{PgStore, SqliteStore};
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// The rows on PostgreSQL, in the order they run.
pub const POSTGRES_NAMES: [&str; 2] = ["idempotency.cycle.postgres", "idempotency.replay.postgres"];
/// The rows on SQLite, in the order they run.
pub const SQLITE_NAMES: [&str; 2] = ["idempotency.cycle.sqlite", "idempotency.replay.sqlite"];

const PG_POOL: u32 = 10;
const SQLITE_POOL: u32 = 8;
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the SQL rows run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// A PostgreSQL URL.
    Postgres(String),
    /// A SQLite URL (a file).
    Sqlite(String),
    /// A SQLite file in the temporary directory, removed afterwards.
    SqliteTemp,
}

impl Target {
    /// The targets `--database` and `--sql-rows` ask for.
    pub(crate) fn from_args(urls: &[String], sql_rows: bool) -> Result<Vec<Self>, BenchError> {
        let mut out = Vec::new();
        for url in urls {
            if url.starts_with("postgres://") || url.starts_with("postgresql://") {
                out.push(Self::Postgres(url.clone()));
            } else if url.starts_with("sqlite:") && !url.contains(":memory:") {
                out.push(Self::Sqlite(url.clone()));
            } else {
                return Err(BenchError::DatabaseUrl(super::super::error::redact(url)));
            }
        }
        if sql_rows && !out.iter().any(|t| !matches!(t, Self::Postgres(_))) {
            out.push(Self::SqliteTemp);
        }
        Ok(out)
    }

    /// The row names this target reports.
    pub(crate) fn names(&self) -> [&'static str; 2] {
        match self {
            Self::Postgres(_) => POSTGRES_NAMES,
            Self::Sqlite(_) | Self::SqliteTemp => SQLITE_NAMES,
        }
    }
}

/// Measures both rows on `target`, in a table of this run's.
pub(crate) async fn rows(
    target: &Target,
    load: &Load,
    run: u64,
) -> Result<Vec<(&'static str, Sample)>, BenchError> {
    let table = format!("norepeat_bench_{:08x}", run as u32);
    let [cycle, replay] = target.names();
    match target {
        Target::Postgres(url) => {
            let pool = PgPoolOptions::new()
                .max_connections(PG_POOL)
                .acquire_timeout(ACQUIRE_TIMEOUT)
                .connect(url)
                .await?;
            let store = PgStore::builder(pool.clone())
                .table(&table)
                .build()
                .map_err(|e| BenchError::unexpected(cycle, e.to_string()))?;
            store.migrate().await?;
            let out = both(&store, load, run, cycle, replay).await;
            drop_table(&pool, &table).await;
            pool.close().await;
            out
        }
        Target::Sqlite(url) => {
            sqlite(SqliteConnectOptions::from_str(url)?, &table, load, run).await
        }
        Target::SqliteTemp => {
            let path = temp_file(run);
            let opts = SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true);
            let out = sqlite(opts, &table, load, run).await;
            for suffix in ["", "-wal", "-shm"] {
                let mut p = path.clone().into_os_string();
                p.push(suffix);
                let _ = std::fs::remove_file(p);
            }
            out
        }
    }
}

async fn sqlite(
    opts: SqliteConnectOptions,
    table: &str,
    load: &Load,
    run: u64,
) -> Result<Vec<(&'static str, Sample)>, BenchError> {
    let [cycle, replay] = SQLITE_NAMES;
    let opts = opts
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(BUSY_TIMEOUT);
    let pool = SqlitePoolOptions::new()
        .max_connections(SQLITE_POOL)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(opts)
        .await?;
    let store = SqliteStore::builder(pool.clone())
        .table(table)
        .build()
        .map_err(|e| BenchError::unexpected(cycle, e.to_string()))?;
    store.migrate().await?;
    let out = both(&store, load, run, cycle, replay).await;
    drop_table(&pool, table).await;
    pool.close().await;
    out
}

async fn both<G: norepeat::store::KeyValueStore + Clone>(
    store: &G,
    load: &Load,
    run: u64,
    cycle: &'static str,
    replay: &'static str,
) -> Result<Vec<(&'static str, Sample)>, BenchError> {
    Ok(vec![
        (cycle, cycle_on(store, load, run, cycle).await?),
        (replay, replay_on(store, load, run, replay).await?),
    ])
}

/// Drops the run's table (best effort: a failure is logged, the figures
/// stand).
async fn drop_table<DB: sqlx::Database>(pool: &sqlx::Pool<DB>, table: &str)
where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    // The name was built here from hex digits only.
    let sql = sqlx::AssertSqlSafe(format!("DROP TABLE IF EXISTS {table}"));
    if let Err(e) = sqlx::raw_sql(sql).execute(pool).await {
        tracing::warn!(error = %e, table, "could not drop the bench table");
    }
}

fn temp_file(run: u64) -> PathBuf {
    std::env::temp_dir().join(format!("norepeat-bench-{run:016x}.db"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_come_from_the_options() {
        let urls = |u: &[&str]| u.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(Target::from_args(&[], false).unwrap(), vec![]);
        assert_eq!(
            Target::from_args(&[], true).unwrap(),
            vec![Target::SqliteTemp]
        );
        let pg = "postgres://postgres@127.0.0.1/x";
        assert_eq!(
            Target::from_args(&urls(&[pg]), true).unwrap(),
            vec![Target::Postgres(pg.to_owned()), Target::SqliteTemp]
        );
        assert_eq!(
            Target::from_args(&urls(&["sqlite://b.db"]), true).unwrap(),
            vec![Target::Sqlite("sqlite://b.db".to_owned())]
        );
        for bad in ["redis://x", "sqlite::memory:", "mysql://x"] {
            assert!(Target::from_args(&urls(&[bad]), false).is_err(), "{bad}");
        }
    }
}
