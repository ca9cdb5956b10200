//! Where `POST /payments` keeps its idempotency records
//! (`NOREPEAT_IDEMPOTENCY_STORE`), and the one place outside the database
//! layer that knows which backend a record commits on: routes build on a
//! [`PaymentsStore`] through [`PaymentsRoute`], whatever the store's type.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use bytes::Bytes;
use http_body_util::Full;
use norepeat::idempotency::{IdempotentTx, TxError};
use norepeat::store::sql::Reaper;
use norepeat::store::{AnyStore, KeyValueStore, MemoryStore, PgStore, SqliteStore, StoreError};

use crate::config::IdempotencyStore;
use crate::db::{Db, PaymentTx};

/// How often each instance deletes expired idempotency rows.
const REAP_EVERY: Duration = Duration::from_secs(60);

/// The idempotency store of `POST /payments` (`NOREPEAT_IDEMPOTENCY_STORE`).
#[derive(Clone)]
pub enum PaymentsStore {
    /// The primary store (Redis, or memory without `REDIS_URL`).
    Primary(&'static str),
    /// This process's memory, while the other guards use Redis.
    Memory(MemoryStore),
    /// The shop's PostgreSQL database, completed in the payment's
    /// transaction; the reaper runs while any clone lives.
    Postgres(PgStore, Arc<Reaper>),
    /// The shop's SQLite database, likewise.
    Sqlite(SqliteStore, Arc<Reaper>),
}

/// What a route builds from the payments store, once per kind of store:
/// the store's type is a type parameter, so no caller matches on a backend.
pub trait PaymentsRoute {
    /// What is built (a method router).
    type Output;
    /// On a key-value store: the record is completed after the handler.
    fn key_value<G: KeyValueStore + Clone>(self, store: G) -> Self::Output;
    /// On the shop's database: the record commits in the payment's own
    /// transaction ([`DatabaseRecords::commit`]).
    fn in_database<G: DatabaseRecords>(self, store: G) -> Self::Output;
}

/// A store in the shop's database, whose idempotency record commits in the
/// transaction of [`Db::begin_payment`].
pub trait DatabaseRecords: KeyValueStore + Clone {
    /// Completes `idem`'s record with `response` and commits it with `tx`;
    /// `None` when `tx` is on another backend than the store.
    fn commit(
        idem: &IdempotentTx<Self>,
        tx: PaymentTx,
        response: Response,
    ) -> impl Future<Output = Option<Result<Response<Full<Bytes>>, TxError>>> + Send;
}

impl DatabaseRecords for PgStore {
    async fn commit(
        idem: &IdempotentTx<Self>,
        tx: PaymentTx,
        response: Response,
    ) -> Option<Result<Response<Full<Bytes>>, TxError>> {
        match tx {
            PaymentTx::Postgres(tx) => Some(idem.commit(tx, response).await),
            PaymentTx::Sqlite(_) => None,
        }
    }
}

impl DatabaseRecords for SqliteStore {
    async fn commit(
        idem: &IdempotentTx<Self>,
        tx: PaymentTx,
        response: Response,
    ) -> Option<Result<Response<Full<Bytes>>, TxError>> {
        match tx {
            PaymentTx::Sqlite(tx) => Some(idem.commit(tx, response).await),
            PaymentTx::Postgres(_) => None,
        }
    }
}

impl PaymentsStore {
    /// `redis`, `memory` or `database`, as `/healthz` says it.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            PaymentsStore::Primary(name) => name,
            PaymentsStore::Memory(_) => "memory",
            PaymentsStore::Postgres(..) | PaymentsStore::Sqlite(..) => "database",
        }
    }

    /// Builds `route` on this store (`primary` for [`PaymentsStore::Primary`]).
    pub fn build<P: KeyValueStore + Clone, R: PaymentsRoute>(
        &self,
        primary: &P,
        route: R,
    ) -> R::Output {
        match self {
            PaymentsStore::Primary(_) => route.key_value(primary.clone()),
            PaymentsStore::Memory(m) => route.key_value(m.clone()),
            PaymentsStore::Postgres(pg, _) => route.in_database(pg.clone()),
            PaymentsStore::Sqlite(lite, _) => route.in_database(lite.clone()),
        }
    }

    /// The store for `kind` (migrating the table and starting the reaper
    /// for `database`).
    pub(crate) async fn open(
        kind: IdempotencyStore,
        primary: &AnyStore,
        db: &Db,
    ) -> Result<Self, StoreError> {
        Ok(match (kind, primary) {
            (IdempotencyStore::Redis, _) => PaymentsStore::Primary("redis"),
            (IdempotencyStore::Memory, AnyStore::Memory(_)) => PaymentsStore::Primary("memory"),
            (IdempotencyStore::Memory, _) => PaymentsStore::Memory(MemoryStore::default()),
            (IdempotencyStore::Database, _) => match db {
                Db::Postgres(pool) => {
                    let store = PgStore::new(pool.clone());
                    store.migrate().await?;
                    let reaper = Arc::new(store.spawn_reaper(REAP_EVERY));
                    PaymentsStore::Postgres(store, reaper)
                }
                Db::Sqlite(pool) => {
                    let store = SqliteStore::new(pool.clone());
                    store.migrate().await?;
                    let reaper = Arc::new(store.spawn_reaper(REAP_EVERY));
                    PaymentsStore::Sqlite(store, reaper)
                }
            },
        })
    }
}
