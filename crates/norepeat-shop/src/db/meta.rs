//! Whole-database helpers: the secret shared by every instance, and the
//! storm demo's reset.

use futures_util::TryFutureExt as _;
use sqlx::{ColumnIndex, Encode, Executor, Type};

use super::backend::{Backend, Field, Queries};
use super::ids::{hex_decode_32, hex_encode};
use super::retry::retry;
use super::types::DbError;

/// Key of the repeat-token secret in `shop_meta`.
const SECRET_KEY: &str = "repeat_token_secret";

const INSERT_SECRET: &str = "INSERT INTO shop_meta (meta_key, meta_value) VALUES ($1, $2) \
     ON CONFLICT (meta_key) DO NOTHING";
const SELECT_SECRET: &str = "SELECT meta_value FROM shop_meta WHERE meta_key = $1";
/// What [`Queries::reset`] empties, children before parents.
const RESET: [&str; 5] = [
    "DELETE FROM payments",
    "DELETE FROM outbox",
    "DELETE FROM points_ledger",
    "DELETE FROM orders",
    "DELETE FROM order_windows",
];

impl<DB> Queries<'_, DB>
where
    DB: Backend,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
    String: Field<DB>,
    i64: Field<DB>,
    usize: ColumnIndex<DB::Row>,
{
    /// Stores a random candidate unless a secret exists, then reads back
    /// whichever won.
    pub(super) async fn shared_secret(&self) -> Result<[u8; 32], DbError> {
        let candidate = hex_encode(&rand::random::<[u8; 32]>());
        retry(|| {
            sqlx::query::<DB>(INSERT_SECRET)
                .bind(SECRET_KEY)
                .bind(candidate.as_str())
                .execute(self.pool)
                .map_err(DbError::from)
        })
        .await?;
        let stored: String = sqlx::query_scalar::<DB, String>(SELECT_SECRET)
            .bind(SECRET_KEY)
            .fetch_one(self.pool)
            .await?;
        hex_decode_32(&stored)
            .ok_or_else(|| DbError::Corrupt("shared secret is not 32 hex-encoded bytes".into()))
    }

    /// Deletes all orders, payments, points and outbox rows in one
    /// transaction; stock and the shared secret are kept.
    pub(super) async fn reset(&self) -> Result<(), DbError> {
        retry(|| async {
            let mut tx = self.begin().await?;
            for sql in RESET {
                sqlx::query::<DB>(sql).execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok(())
        })
        .await
    }
}
