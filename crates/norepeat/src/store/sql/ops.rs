//! The store operations on each database: the key-value operations, the
//! transactional completion, migration and reaping.

use super::statements::{sql, ttl_millis};
use super::{Reaper, SqlStore, TxStore, sealed};
use crate::store::{KeyOp, KeyReply, KeyValueStore, StoreError};
use std::time::Duration;

/// The operations, written once and compiled for each database (their
/// sqlx types differ; the statements come from [`Statements`](super::statements::Statements)).
macro_rules! impl_sql_store {
    ($db:ty) => {
        impl SqlStore<$db> {
            /// Creates the table and its expiry index if they do not exist
            /// (see [Migration](super#migration)). Safe to run on every
            /// start, from every instance at once.
            ///
            /// # Errors
            /// When the database refuses the DDL or cannot be reached.
            pub async fn migrate(&self) -> Result<(), StoreError> {
                let mut tx = self.inner.pool.begin().await.map_err(|e| self.err(e))?;
                for ddl in &self.inner.sql.ddl {
                    sqlx::query(sql(ddl))
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| self.err(e))?;
                }
                tx.commit().await.map_err(|e| self.err(e))
            }

            /// Deletes every row that has expired, in batches (see
            /// [Reaping](super#reaping)), and returns how many it deleted.
            /// For a test, a cron job, or a process that schedules its own
            /// maintenance.
            ///
            /// # Errors
            /// When a batch fails; batches before it stay deleted.
            pub async fn reap_once(&self) -> Result<u64, StoreError> {
                let batch = self.inner.reap_batch;
                let mut total = 0;
                loop {
                    let done = sqlx::query(sql(&self.inner.sql.reap))
                        .bind(i64::from(batch))
                        .execute(&self.inner.pool)
                        .await
                        .map_err(|e| self.err(e))?
                        .rows_affected();
                    total += done;
                    if done < u64::from(batch) {
                        return Ok(total);
                    }
                }
            }

            /// [`replace_if_equals`](crate::store::KeyValueStoreExt::replace_if_equals) on
            /// `conn` instead of the pool: inside the caller's transaction,
            /// so the completed record commits (or rolls back) with the
            /// caller's own writes. This is the owner check of
            /// [transactional completion](super#transactional-completion):
            /// `false` means the claim is no longer `expected` (it expired,
            /// or another caller took the key over), and the caller must
            /// roll back rather than commit its effect.
            ///
            /// The `UPDATE` locks the row until the transaction ends, so no
            /// other caller can take the key over between this check and
            /// the commit.
            ///
            /// # Errors
            /// When the statement fails; the transaction should be rolled
            /// back.
            pub async fn replace_if_equals_in(
                &self,
                conn: &mut <$db as sqlx::Database>::Connection,
                key: &str,
                expected: &[u8],
                value: &[u8],
                ttl: Duration,
            ) -> Result<bool, StoreError> {
                let done = sqlx::query(sql(&self.inner.sql.replace))
                    .bind(key)
                    .bind(expected)
                    .bind(value)
                    .bind(ttl_millis(ttl))
                    .execute(&mut *conn)
                    .await
                    .map_err(|e| self.err(e))?;
                Ok(done.rows_affected() == 1)
            }

            /// Runs [`reap_once`](Self::reap_once) every `every` (the first
            /// run at once) in a spawned task, until the returned handle is
            /// dropped. Failures are logged and retried at the next
            /// interval. Must be called within a tokio runtime.
            pub fn spawn_reaper(&self, every: Duration) -> Reaper {
                let store = self.clone();
                Reaper::spawn(every, <$db as sealed::Sealed>::KIND, move || {
                    let store = store.clone();
                    async move { store.reap_once().await }
                })
            }
        }

        impl sealed::Store for SqlStore<$db> {}

        impl TxStore for SqlStore<$db> {
            type Database = $db;

            fn begin_tx(
                &self,
            ) -> futures_util::future::BoxFuture<
                '_,
                Result<sqlx::Transaction<'static, $db>, StoreError>,
            > {
                Box::pin(async move { self.inner.pool.begin().await.map_err(|e| self.err(e)) })
            }

            fn replace_in_tx<'a>(
                &'a self,
                tx: &'a mut sqlx::Transaction<'static, $db>,
                key: &'a str,
                expected: &'a [u8],
                value: &'a [u8],
                ttl: Duration,
            ) -> futures_util::future::BoxFuture<'a, Result<bool, StoreError>> {
                Box::pin(self.replace_if_equals_in(&mut *tx, key, expected, value, ttl))
            }

            fn commit_tx(
                &self,
                tx: sqlx::Transaction<'static, $db>,
            ) -> futures_util::future::BoxFuture<'_, Result<(), StoreError>> {
                Box::pin(async move { tx.commit().await.map_err(|e| self.err(e)) })
            }
        }

        impl KeyValueStore for SqlStore<$db> {
            async fn execute(&self, op: KeyOp<'_>) -> Result<KeyReply, StoreError> {
                let pool = &self.inner.pool;
                let done = match op {
                    KeyOp::PutIfAbsent { key, value, ttl } => {
                        let nonce: i64 = rand::random();
                        let (stored, current): (bool, Vec<u8>) =
                            sqlx::query_as(sql(&self.inner.sql.put))
                                .bind(key)
                                .bind(value)
                                .bind(ttl_millis(ttl))
                                .bind(nonce)
                                .fetch_one(pool)
                                .await
                                .map_err(|e| self.err(e))?;
                        return Ok(KeyReply::Held(
                            (!stored).then(|| bytes::Bytes::from(current)),
                        ));
                    }
                    KeyOp::Get { key } => {
                        let value: Option<(Vec<u8>,)> = sqlx::query_as(sql(&self.inner.sql.get))
                            .bind(key)
                            .fetch_optional(pool)
                            .await
                            .map_err(|e| self.err(e))?;
                        return Ok(KeyReply::Held(value.map(|(v,)| bytes::Bytes::from(v))));
                    }
                    KeyOp::DeleteIfEquals { key, expected } => {
                        sqlx::query(sql(&self.inner.sql.delete))
                            .bind(key)
                            .bind(expected)
                            .execute(pool)
                            .await
                    }
                    KeyOp::ExpireIfEquals { key, expected, ttl } => {
                        sqlx::query(sql(&self.inner.sql.expire))
                            .bind(key)
                            .bind(expected)
                            .bind(ttl_millis(ttl))
                            .execute(pool)
                            .await
                    }
                    KeyOp::ReplaceIfEquals {
                        key,
                        expected,
                        value,
                        ttl,
                    } => {
                        sqlx::query(sql(&self.inner.sql.replace))
                            .bind(key)
                            .bind(expected)
                            .bind(value)
                            .bind(ttl_millis(ttl))
                            .execute(pool)
                            .await
                    }
                };
                let done = done.map_err(|e| self.err(e))?;
                Ok(KeyReply::Changed(done.rows_affected() == 1))
            }

            fn kind(&self) -> &'static str {
                <$db as sealed::Sealed>::KIND
            }
        }
    };
}

#[cfg(feature = "postgres")]
impl_sql_store!(sqlx::Postgres);
#[cfg(feature = "sqlite")]
impl_sql_store!(sqlx::Sqlite);
