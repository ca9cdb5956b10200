//! What the two backends do differently, and [`Queries`], the generic handle
//! every aggregate's queries hang off.
//!
//! The SQL is written once and runs on both SQLite and PostgreSQL: `$N`
//! placeholders (SQLite accepts them), `ON CONFLICT ... DO NOTHING`,
//! `RETURNING`, and every integer read back is a 64-bit value
//! (`CAST(... AS BIGINT)` around aggregates, which PostgreSQL would otherwise
//! return as NUMERIC). sqlx carries the rest: the query functions are generic
//! over [`sqlx::Database`], and [`Backend`] holds the little that is not SQL
//! text shared by both.
//!
//! Write transactions start with `BEGIN IMMEDIATE` on SQLite (take the write
//! lock up front, waiting up to `busy_timeout`, instead of failing with
//! `SQLITE_BUSY_SNAPSHOT` when a read transaction tries to upgrade) and a plain
//! `BEGIN` (READ COMMITTED) on PostgreSQL, where the conditional updates and the
//! unique index do the work. Every write is wrapped in
//! [`retry`](super::retry::retry), which runs the whole transaction again a
//! bounded number of times on transient errors.

use sqlx::{Database, Decode, Encode, IntoArguments, Pool, Postgres, Sqlite, Transaction, Type};

use super::DbError;

/// A database the shop runs on: [`Sqlite`] or [`Postgres`].
///
/// The bound on `Arguments` is one sqlx's generic `query(...).execute(...)`
/// needs; written here as a supertrait bound, it is implied wherever
/// `DB: Backend` is.
pub(super) trait Backend: Database<Arguments: IntoArguments<Self>> {
    /// The statement that opens a write transaction.
    const BEGIN: &'static str;

    /// Rows changed by an `INSERT`/`UPDATE`/`DELETE` (an inherent method of
    /// each backend's result type, not part of sqlx's `Database` trait).
    fn rows_affected(result: &Self::QueryResult) -> u64;
}

impl Backend for Sqlite {
    /// Takes the write lock up front: a deferred transaction that reads and
    /// then writes fails with `SQLITE_BUSY_SNAPSHOT` (not covered by the busy
    /// timeout) when another connection wrote in between.
    const BEGIN: &'static str = "BEGIN IMMEDIATE";

    fn rows_affected(result: &Self::QueryResult) -> u64 {
        result.rows_affected()
    }
}

impl Backend for Postgres {
    /// READ COMMITTED: the conditional updates and unique indexes decide.
    const BEGIN: &'static str = "BEGIN";

    fn rows_affected(result: &Self::QueryResult) -> u64 {
        result.rows_affected()
    }
}

/// A Rust type stored in and read from a column of `DB` (here `i64` and
/// `String`). Only bundles sqlx's three traits, so that a `where` clause can
/// say it in one line.
pub(super) trait Field<DB: Database>:
    Type<DB> + for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Send
{
}

impl<DB: Database, T> Field<DB> for T where
    T: Type<DB> + for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Send
{
}

/// The shop's queries on one pool, generic over the backend. Each
/// aggregate's module (orders, payments, outbox, points, meta) adds its own
/// `impl` block, with the bounds sqlx needs spelled out once per block:
///
/// ```text
/// impl<DB> Queries<'_, DB>
/// where
///     DB: Backend,
///     for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
///     for<'a> &'a str: Encode<'a, DB> + Type<DB>,
///     String: Field<DB>,
///     i64: Field<DB>,
///     usize: ColumnIndex<DB::Row>,
/// ```
///
/// (Rust does not imply a trait's `where` clauses at its use sites, so they
/// cannot live on [`Backend`] alone.)
#[derive(Debug)]
pub(super) struct Queries<'p, DB: Database> {
    pub(super) pool: &'p Pool<DB>,
}

impl<'p, DB: Backend> Queries<'p, DB> {
    pub(super) fn new(pool: &'p Pool<DB>) -> Self {
        Self { pool }
    }

    /// Opens a write transaction with [`Backend::BEGIN`].
    pub(super) async fn begin(&self) -> Result<Transaction<'static, DB>, DbError> {
        Ok(self.pool.begin_with(DB::BEGIN).await?)
    }
}
