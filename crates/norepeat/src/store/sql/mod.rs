// Over 400 lines because most of it is the module's documentation: the
// table, its statements, migration, reaping and transactional completion.
//! Records in a SQL table: [`SqlStore`] on PostgreSQL (feature `postgres`)
//! or SQLite (feature `sqlite`), through [sqlx](https://docs.rs/sqlx).
//!
//! Redis forgets: on a restart without persistence, on a failover that loses
//! the last writes, on eviction. A record kept in the database that holds the
//! effect lasts as long as the effect does. [`SqlStore`] is a
//! [`KeyValueStore`]: the four conditional operations, with the semantics of
//! the Redis store, on one table. It has no rate algorithms (counters are
//! hot and disposable, a poor fit for a table), so it is not a
//! [`Store`](super::Store) and a rate limiter over it does not compile.
//!
//! ```
//! use norepeat::store::{KeyValueStoreExt, SqliteStore};
//! use sqlx::sqlite::SqlitePoolOptions;
//! use std::time::Duration;
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // One connection: every connection to `sqlite::memory:` is its own database.
//! let pool = SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await?;
//! let store = SqliteStore::new(pool);
//! store.migrate().await?;
//! let ttl = Duration::from_secs(30);
//! assert_eq!(store.put_if_absent("order-7", b"owner-a", ttl).await?, None);
//! assert_eq!(store.put_if_absent("order-7", b"owner-b", ttl).await?.as_deref(), Some(&b"owner-a"[..]));
//! assert!(store.replace_if_equals("order-7", b"owner-a", b"done", ttl).await?);
//! # Ok(()) }
//! ```
//!
//! # The table
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS norepeat_keys (
//!     key        TEXT   PRIMARY KEY,
//!     value      BYTEA  NOT NULL,   -- BLOB on SQLite
//!     expires_at BIGINT NOT NULL,   -- milliseconds since the Unix epoch, database clock
//!     nonce      BIGINT NOT NULL    -- which put_if_absent call wrote the value
//! );
//! CREATE INDEX IF NOT EXISTS norepeat_keys_expires_at ON norepeat_keys (expires_at);
//! ```
//!
//! Keys are `TEXT` (PostgreSQL refuses a NUL character in one; the keys
//! norepeat builds are hashes and never hold one), values are bytes.
//!
//! The name is yours to choose ([`SqlStoreBuilder::table`], default
//! [`DEFAULT_TABLE`]; `schema.table` works on PostgreSQL). Several stores
//! may share a database under different tables.
//!
//! ## Migration
//!
//! [`SqlStore::migrate`] runs the DDL above, idempotently (`IF NOT EXISTS`),
//! in one transaction; on PostgreSQL it first takes a transaction-scoped
//! advisory lock, so instances starting together do not race on the
//! catalogue. It does **not** use sqlx's migration history: an application
//! that runs its own `sqlx::migrate!` against the same database keeps a
//! `_sqlx_migrations` table that must list exactly the application's
//! migrations (sqlx refuses to run when it finds an applied version it does
//! not know), so a second migration set recorded there would break the
//! application's migrator. Call [`SqlStore::migrate`] at start-up before or
//! after your own migrations, or copy the DDL above into one of your own
//! migration files and skip it.
//!
//! # Semantics, one statement each
//!
//! Each operation is one SQL statement, run on its own (autocommit), so it
//! is atomic against every other operation on the key, from any process:
//!
//! | operation | statement |
//! |---|---|
//! | [`put_if_absent`](super::KeyValueStoreExt::put_if_absent) | `INSERT ... ON CONFLICT (key) DO UPDATE SET value = CASE WHEN expired THEN new ELSE old END, ... RETURNING nonce = $mine, value` |
//! | [`delete_if_equals`](super::KeyValueStoreExt::delete_if_equals) | `DELETE ... WHERE key = $1 AND value = $2 AND expires_at > now` |
//! | [`expire_if_equals`](super::KeyValueStoreExt::expire_if_equals) | `UPDATE ... SET expires_at = now + ttl WHERE key = $1 AND value = $2 AND expires_at > now` |
//! | [`replace_if_equals`](super::KeyValueStoreExt::replace_if_equals) | `UPDATE ... SET value = $3, expires_at = now + ttl WHERE key = $1 AND value = $2 AND expires_at > now` |
//!
//! An expired row is absent: every statement tests `expires_at` itself, in
//! the same statement that acts, so it never matters whether the reaper has
//! come by yet. Nothing reads a row and then writes it in a second step.
//!
//! `put_if_absent` must say whether it stored its value or, if not, which
//! value is there. `INSERT ... ON CONFLICT DO UPDATE` locks the conflicting
//! row and sees its latest committed version (a `SELECT` in the same
//! statement would see an older snapshot, and could miss a row another
//! transaction inserted a moment ago). So the conflict branch always
//! updates: it writes the new value if the old one has expired, and the old
//! value back otherwise. `RETURNING` then shows only the row as it now is,
//! and the `nonce` column tells the two cases apart: each call writes a
//! fresh random 64-bit number with its value, and it stored its value
//! exactly when the row carries its number. (Comparing values instead would
//! misjudge a call that meets an equal live value; PostgreSQL 18's
//! `RETURNING old.*` would do, but this has to work on older servers and on
//! SQLite.) The price: a duplicate also rewrites the row (same content), a
//! dead tuple for vacuum on PostgreSQL.
//!
//! **Clock.** Times are the database's clock, in milliseconds since the Unix
//! epoch: `statement_timestamp()` on PostgreSQL (fixed for the statement,
//! not the transaction start, so it stays right inside a long transaction),
//! `julianday('now')` on SQLite (fixed for the statement too). Every
//! instance of the application shares that one clock, as they share Redis's
//! clock for Redis TTLs; the application servers' clocks play no part. TTLs
//! are whole milliseconds, at least one.
//!
//! On PostgreSQL the statements run at `READ COMMITTED` (the default) and
//! need no stronger level: each touches one row, and an `UPDATE`, `DELETE`
//! or `ON CONFLICT` that waits on a concurrent writer re-checks its `WHERE`
//! on the row's newest version. On SQLite a writing statement holds the
//! database's write lock for its whole run; give the pool a busy timeout
//! (sqlx's default is 5 s) and, for concurrency, WAL journal mode.
//!
//! # Reaping
//!
//! Expired rows are invisible but take space. [`SqlStore::reap_once`]
//! deletes them in batches of [`SqlStoreBuilder::reap_batch`] rows (1000 by
//! default), one short statement per batch, until a batch comes back short;
//! [`SqlStore::spawn_reaper`] does that on an interval you set, in a task
//! that stops when its [`Reaper`] handle is dropped. A batch is
//!
//! ```sql
//! DELETE FROM t WHERE key IN (
//!     SELECT key FROM t WHERE expires_at <= now LIMIT n FOR UPDATE SKIP LOCKED  -- SKIP LOCKED: PostgreSQL
//! ) AND expires_at <= now
//! ```
//!
//! so it is safe to run on every instance at once: two reapers skip each
//! other's rows instead of queueing behind them, a row a caller is reviving
//! (a `put_if_absent` over the expired row) is either locked and skipped or
//! re-checked and kept, and no batch holds locks for long. Reaping never
//! changes what an operation answers, only when the space comes back.
//!
//! # Compared with the references
//!
//! Two designs are the usual references for durable idempotency records:
//! AWS Lambda Powertools' idempotency utility (records in DynamoDB) and
//! Brandur Leach's "Implementing Stripe-like Idempotency Keys in Postgres".
//!
//! **Claiming a key (atomic phase one).**
//! - Powertools: a conditional `PutItem` (`attribute_not_exists(id) OR
//!   expiration < now OR (status = INPROGRESS AND in_progress_expiration <
//!   now)`); on a failed condition it reads the existing item (newer
//!   versions get it back from the same call) to replay it or to report
//!   "in progress".
//! - Brandur: an `INSERT` into `idempotency_keys` under a unique
//!   `(user_id, idempotency_key)` inside a `SERIALIZABLE` transaction,
//!   retried on serialization failure; a row with `locked_at` set is in
//!   progress.
//! - Here: one `INSERT ... ON CONFLICT DO UPDATE ... RETURNING`, which
//!   stores the claim or returns the live record in the same round trip,
//!   like Powertools' conditional put with the old item returned. It needs
//!   only `READ COMMITTED`: the statement touches one row and takes its lock.
//!
//! **Expiry and takeover of an abandoned claim (recovery).**
//! - Powertools: `in_progress_expiration` (the Lambda's remaining time)
//!   lets a later request take over an in-progress record.
//! - Brandur: `locked_at` older than a timeout lets a retry take the key
//!   over, and it resumes from the key's `recovery_point`; a *completer*
//!   process finds stalled keys and drives them to the end.
//! - Here: a claim is a row with a short TTL (the lease), renewed by
//!   `expire_if_equals` while its owner works; when the owner dies the row
//!   expires and the next `put_if_absent` takes it over, in the statement
//!   that sees it expired. Owner checks (`... WHERE value = $expected`) make
//!   a late, taken-over owner unable to renew, complete or release the new
//!   owner's claim. There are no recovery points and no completer: a claim
//!   that dies re-runs from the start, which is right when the effect and
//!   the completed record commit together (see below) and wrong for an
//!   effect that was made elsewhere and not recorded.
//!
//! **Completion (the last atomic phase).**
//! - Powertools: an `UpdateItem` to `COMPLETED` with the response, a
//!   separate write after the handler's effect in another system.
//! - Brandur: the last phase's transaction writes the response and
//!   `recovery_point = finished` together with the local effects of that
//!   phase.
//! - Here: `replace_if_equals` swaps the claim for the completed record,
//!   only while the claim is still ours; with
//!   [transactional completion](#transactional-completion) that same
//!   owner-checked `UPDATE` runs inside the effect's transaction, like
//!   Brandur's last phase.
//!
//! **Reaping.**
//! - Powertools: DynamoDB's TTL deletes expired items in the background,
//!   often long after expiry; the conditions compare `expiration` to now
//!   themselves, so a late deletion changes nothing.
//! - Brandur: a reaper deletes keys older than a fixed age (72 hours).
//! - Here: every statement treats `expires_at <= now` as absent (as
//!   Powertools does), and [`SqlStore::reap_once`] deletes in bounded
//!   batches with `SKIP LOCKED`, on every instance if you like.
//!
//! **Under a crash.**
//! - Powertools: effect and record live in different systems. A crash after
//!   the effect and before `COMPLETED` leaves the record in progress until
//!   it expires, then a retry runs the effect again; a crash after the claim
//!   and before the effect costs only the wait.
//! - Brandur: every phase is a transaction that moves the recovery point
//!   with its local effects, so a crash leaves the key at a recovery point
//!   from which a retry or the completer continues; foreign calls (Stripe)
//!   between phases rely on the foreign service's own idempotency key.
//! - Here, the store alone: each operation is atomic and durable once it
//!   returns. A crash between an effect made elsewhere and the completion
//!   leaves the claim to expire and a retry runs again, the same guarantee
//!   as Powertools. With [transactional
//!   completion](#transactional-completion) the effect and the completed
//!   record commit together: a crash leaves either the open claim and no
//!   effect (the retry runs once, after the lease) or both.
//!
//! ## Transactional completion
//!
//! With the effect in the same database as the record, the completion can
//! join the effect's transaction. The claim stays a short autocommitted
//! statement (so a concurrent request sees it at once and gets 409 or
//! waits), and the last phase is one transaction:
//!
//! ```sql
//! BEGIN;
//!   INSERT INTO payments ...;                        -- the handler's writes
//!   UPDATE norepeat_keys SET value = $completed, expires_at = now + retention
//!    WHERE key = $1 AND value = $our_claim AND expires_at > now;
//!   -- 0 rows: the lease was lost (expired, maybe taken over): ROLLBACK
//! COMMIT;
//! ```
//!
//! In an axum handler behind the
//! [`IdempotencyLayer`](crate::idempotency::IdempotencyLayer) this is
//! [`IdempotentTx::commit`](crate::idempotency::IdempotentTx::commit): the
//! layer puts an `IdempotentTx` in the request's extensions once it holds
//! the claim; the handler makes its writes in a transaction, builds its
//! response and hands both over; the record (status, replayed headers,
//! body, exactly what the layer would store) is written inside the
//! transaction, which then commits. The layer sees the record completed and
//! stores nothing more. A message consumer or any other code uses the
//! primitive underneath, [`SqlStore::replace_if_equals_in`]: claim with
//! [`put_if_absent`](super::KeyValueStoreExt::put_if_absent), then effect and
//! completion in one transaction:
//!
//! ```no_run
//! use norepeat::store::{KeyValueStoreExt, PgStore};
//! use std::time::Duration;
//! # async fn award(store: &PgStore, pool: &sqlx::PgPool, message_id: &str, user: &str) -> Result<(), Box<dyn std::error::Error>> {
//! let owner: [u8; 16] = rand::random();
//! if store.put_if_absent(message_id, &owner, Duration::from_secs(30)).await?.is_some() {
//!     return Ok(()); // done before, or being done now: ack or redeliver later
//! }
//! let mut tx = pool.begin().await?;
//! sqlx::query("UPDATE points SET balance = balance + 10 WHERE user_id = $1")
//!     .bind(user)
//!     .execute(&mut *tx)
//!     .await?;
//! let day = Duration::from_secs(24 * 3600);
//! if store.replace_if_equals_in(&mut tx, message_id, &owner, b"done", day).await? {
//!     tx.commit().await?; // the points and the record, together
//! } // else: the claim was lost; dropping `tx` rolls the points back
//! # Ok(()) }
//! ```
//!
//! What a crash (or a dropped future, or a lost lease) leaves, at each
//! point:
//!
//! | the process stops | left behind | a retry |
//! |---|---|---|
//! | before the claim | nothing | runs |
//! | after the claim, before `COMMIT` reaches the database | the claim, no effect (the open transaction is rolled back when its connection closes or its `Transaction` is dropped) | 409 until the lease ends, then runs once |
//! | while `COMMIT` is in flight | one of the two rows above or below, never a mix: the effect and the record are in the same commit | as for that row |
//! | after `COMMIT` | the effect and its completed record | replays |
//! | the lease ran out before the `UPDATE` | the `UPDATE` matches no row, the transaction is rolled back: no effect from this owner | gets the new owner's answer |
//!
//! Never the effect with the key free: the only write that frees a claim
//! early is an owner-checked delete of the *in-progress* value (the
//! layer's release after a 5xx or a panic), which matches nothing once the
//! transaction has committed the completed value. And the `UPDATE` keeps
//! the row locked until `COMMIT` (on SQLite the whole database is), so no
//! other request can take the key over between the owner check and the
//! commit.
//!
//! The limits: only writes to this database are covered. A call to another
//! system in the handler (a card network) is outside the transaction, as in
//! Brandur's design, and needs that system's own idempotency key; a retry
//! after a crash calls it again. And the effect holds its locks until the
//! record is written, so keep the transaction short on SQLite, where one
//! writer blocks all others.
//!
//! Compared with the references, the transactional form closes the gap
//! that Powertools leaves open (an effect made, then a crash before
//! `COMPLETED`, then the effect again after expiry): here there is no such
//! moment. It is Brandur's atomic phase reduced to one phase, claim aside:
//! no recovery points are needed, since nothing between the claim and the
//! commit survives a crash, and no completer, since an open claim simply
//! expires and the retry starts over. Brandur's reaper deletes keys after a
//! fixed 72 hours; here a completed record lives for the retention the
//! caller chose (24 h in the layer), then the same batch reaper removes it.

mod ops;
#[cfg(feature = "postgres")]
mod postgres;
mod reaper;
#[cfg(feature = "sqlite")]
mod sqlite;
mod statements;

pub use reaper::Reaper;
use statements::{Statements, map_err, valid_identifier};

use super::{KeyValueStore, StoreError};
use sqlx::Pool;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "postgres")]
pub use sqlx::Postgres;
#[cfg(feature = "sqlite")]
pub use sqlx::Sqlite;

/// The table a [`SqlStore`] uses unless told otherwise: `norepeat_keys`.
pub const DEFAULT_TABLE: &str = "norepeat_keys";

/// How many expired rows one reaper statement deletes by default.
pub const DEFAULT_REAP_BATCH: u32 = 1000;

/// A store on PostgreSQL.
#[cfg(feature = "postgres")]
pub type PgStore = SqlStore<sqlx::Postgres>;

/// A store on SQLite.
#[cfg(feature = "sqlite")]
pub type SqliteStore = SqlStore<sqlx::Sqlite>;

mod sealed {
    /// What differs between the databases, kept out of the public API.
    pub trait Sealed: sqlx::Database {
        /// The store's [`kind`](crate::store::KeyValueStore::kind).
        const KIND: &'static str;
        /// An SQL expression: now, in milliseconds since the Unix epoch, on
        /// the database's clock, fixed for the statement.
        const NOW_MS: &'static str;
        /// Appended to the reaper's inner `SELECT`.
        const REAP_LOCK: &'static str;
        /// The DDL, in order, for `table` and its expiry index `index`.
        fn ddl(table: &str, index: &str) -> Vec<String>;
    }

    /// Seals [`TxStore`](super::TxStore).
    pub trait Store {}
}

/// A store whose records can be completed inside a transaction of the
/// caller's: [`PgStore`] and [`SqliteStore`]. Sealed; the methods are for
/// norepeat's own helpers ([`Guarded::run_once_in_tx`](crate::attribute::Guarded::run_once_in_tx)).
#[diagnostic::on_unimplemented(
    message = "`tx = ...` and `run_once_in_tx` need a SQL store: `{Self}` cannot open a database transaction",
    label = "not a `PgStore` or `SqliteStore`",
    note = "name a `PgStore` or `SqliteStore` with `store = ...`"
)]
pub trait TxStore: KeyValueStore + Clone + sealed::Store {
    /// The sqlx database the store's table lives in.
    type Database: sqlx::Database;

    /// A transaction on the store's pool.
    #[doc(hidden)]
    fn begin_tx(
        &self,
    ) -> futures_util::future::BoxFuture<
        '_,
        Result<sqlx::Transaction<'static, Self::Database>, StoreError>,
    >;

    /// [`SqlStore::replace_if_equals_in`] on `tx`.
    #[doc(hidden)]
    fn replace_in_tx<'a>(
        &'a self,
        tx: &'a mut sqlx::Transaction<'static, Self::Database>,
        key: &'a str,
        expected: &'a [u8],
        value: &'a [u8],
        ttl: Duration,
    ) -> futures_util::future::BoxFuture<'a, Result<bool, StoreError>>;

    /// Commits `tx`.
    #[doc(hidden)]
    fn commit_tx(
        &self,
        tx: sqlx::Transaction<'static, Self::Database>,
    ) -> futures_util::future::BoxFuture<'_, Result<(), StoreError>>;
}

/// A database [`SqlStore`] runs on: [`sqlx::Postgres`] (feature
/// `postgres`) or [`sqlx::Sqlite`] (feature `sqlite`). Sealed.
pub trait SqlBackend: sealed::Sealed {}

impl<DB: sealed::Sealed> SqlBackend for DB {}

/// Why a [`SqlStoreBuilder`] refused its settings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SqlConfigError {
    /// The table name is not `name` or `schema.name`, each part a lowercase
    /// ASCII letter or `_` followed by up to 62 lowercase letters, digits or
    /// `_`. (The name is written into SQL, so it is checked, not quoted.)
    #[error(
        "invalid table name {0:?}: expected `name` or `schema.name`, lowercase ASCII letters, digits and `_`, not starting with a digit, at most 63 characters each"
    )]
    InvalidTable(String),
    /// The reaper's batch size is zero.
    #[error("the reaper's batch size must be at least 1")]
    ZeroBatch,
}

/// A [`KeyValueStore`] on one SQL table: PostgreSQL (`PgStore`, feature
/// `postgres`) or SQLite (`SqliteStore`, feature `sqlite`).
///
/// Every operation is one statement with the semantics of the Redis store
/// (see the [module docs](self)). It holds a sqlx pool and is cheap to
/// clone; clones share the pool. Run [`migrate`](Self::migrate) once before
/// use, and a [reaper](Self::spawn_reaper) to reclaim expired rows.
///
/// ```no_run
/// use norepeat::store::PgStore;
/// use std::time::Duration;
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1/shop").await?;
/// let store = PgStore::builder(pool).table("idempotency_records").build()?;
/// store.migrate().await?;
/// let _reaper = store.spawn_reaper(Duration::from_secs(60)); // stops when dropped
/// # Ok(()) }
/// ```
///
/// It has no rate algorithms, so a rate limiter over it is refused when the
/// program is compiled (`RateLimiter` requires [`Store`](super::Store)):
///
/// ```compile_fail,E0277
/// use norepeat::ratelimit::{Quota, RateLimiter};
/// use norepeat::store::SqliteStore;
/// let pool = sqlx::SqlitePool::connect_lazy("sqlite::memory:").unwrap();
/// let limiter = RateLimiter::new(SqliteStore::new(pool), Quota::parse("5/s").unwrap());
/// ```
pub struct SqlStore<DB: SqlBackend> {
    inner: Arc<Inner<DB>>,
}

struct Inner<DB: SqlBackend> {
    pool: Pool<DB>,
    table: String,
    reap_batch: u32,
    sql: Statements,
}

impl<DB: SqlBackend> Clone for SqlStore<DB> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<DB: SqlBackend> fmt::Debug for SqlStore<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlStore")
            .field("kind", &DB::KIND)
            .field("table", &self.inner.table)
            .field("reap_batch", &self.inner.reap_batch)
            .finish_non_exhaustive()
    }
}

impl<DB: SqlBackend> SqlStore<DB> {
    /// A store on `pool` with the default table ([`DEFAULT_TABLE`]) and
    /// reaper batch ([`DEFAULT_REAP_BATCH`]).
    #[must_use]
    pub fn new(pool: Pool<DB>) -> Self {
        Self::build(pool, DEFAULT_TABLE.to_owned(), DEFAULT_REAP_BATCH)
    }

    /// A builder, to choose the table or the reaper's batch size.
    pub fn builder(pool: Pool<DB>) -> SqlStoreBuilder<DB> {
        SqlStoreBuilder {
            pool,
            table: DEFAULT_TABLE.to_owned(),
            reap_batch: DEFAULT_REAP_BATCH,
        }
    }

    fn build(pool: Pool<DB>, table: String, reap_batch: u32) -> Self {
        let sql = Statements::new::<DB>(&table);
        Self {
            inner: Arc::new(Inner {
                pool,
                table,
                reap_batch,
                sql,
            }),
        }
    }

    /// The pool the store runs on.
    #[must_use]
    pub fn pool(&self) -> &Pool<DB> {
        &self.inner.pool
    }

    /// The table the store keeps its rows in.
    #[must_use]
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    pub(crate) fn err(&self, e: sqlx::Error) -> StoreError {
        map_err(e, self.inner.pool.options().get_acquire_timeout())
    }
}

/// Settings of a [`SqlStore`]: its table and its reaper's batch size.
///
/// ```
/// use norepeat::store::SqliteStore;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::SqlitePool::connect_lazy("sqlite::memory:")?;
/// let store = SqliteStore::builder(pool.clone()).table("claims").reap_batch(500).build()?;
/// assert_eq!(store.table(), "claims");
/// assert!(SqliteStore::builder(pool).table("claims; DROP TABLE x").build().is_err());
/// # Ok(()) }
/// ```
#[must_use]
pub struct SqlStoreBuilder<DB: SqlBackend> {
    pool: Pool<DB>,
    table: String,
    reap_batch: u32,
}

impl<DB: SqlBackend> fmt::Debug for SqlStoreBuilder<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlStoreBuilder")
            .field("kind", &DB::KIND)
            .field("table", &self.table)
            .field("reap_batch", &self.reap_batch)
            .finish_non_exhaustive()
    }
}

impl<DB: SqlBackend> SqlStoreBuilder<DB> {
    /// The table's name: `name` or `schema.name`, lowercase ASCII letters,
    /// digits and `_` (default [`DEFAULT_TABLE`]). Checked by
    /// [`build`](Self::build).
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }

    /// How many expired rows one reaper statement deletes (default
    /// [`DEFAULT_REAP_BATCH`]). Smaller batches hold locks for less time.
    pub fn reap_batch(mut self, rows: u32) -> Self {
        self.reap_batch = rows;
        self
    }

    /// The store.
    ///
    /// # Errors
    /// [`SqlConfigError::InvalidTable`] for a table name that is not a plain
    /// identifier (or two joined by a dot), [`SqlConfigError::ZeroBatch`]
    /// for a batch of zero rows.
    pub fn build(self) -> Result<SqlStore<DB>, SqlConfigError> {
        let parts: Vec<&str> = self.table.split('.').collect();
        if parts.len() > 2 || !parts.iter().all(|p| valid_identifier(p)) {
            return Err(SqlConfigError::InvalidTable(self.table));
        }
        if self.reap_batch == 0 {
            return Err(SqlConfigError::ZeroBatch);
        }
        Ok(SqlStore::build(self.pool, self.table, self.reap_batch))
    }
}
