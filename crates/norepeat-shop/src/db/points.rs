//! The points ledger: awarding an order's points once, and a user's total.

use futures_util::TryFutureExt as _;
use sqlx::{ColumnIndex, Encode, Executor, Type};

use super::backend::{Backend, Field, Queries};
use super::ids::now_ms;
use super::retry::retry;
use super::types::DbError;

/// Points per unit ordered.
pub(super) const POINTS_PER_UNIT: i64 = 10;

const AWARD_POINTS: &str = "INSERT INTO points_ledger (order_id, user_id, points, created_at) \
     VALUES ($1, $2, $3, $4) ON CONFLICT (order_id) DO NOTHING";
const SUM_POINTS: &str =
    "SELECT CAST(COALESCE(SUM(points), 0) AS BIGINT) FROM points_ledger WHERE user_id = $1";

impl<DB> Queries<'_, DB>
where
    DB: Backend,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
    String: Field<DB>,
    i64: Field<DB>,
    usize: ColumnIndex<DB::Row>,
{
    /// True if awarded now, false if `order_id`'s points already were.
    pub(super) async fn award_points(
        &self,
        user: &str,
        order_id: &str,
        points: i64,
    ) -> Result<bool, DbError> {
        let now = now_ms();
        let inserted = retry(|| {
            sqlx::query::<DB>(AWARD_POINTS)
                .bind(order_id)
                .bind(user)
                .bind(points)
                .bind(now)
                .execute(self.pool)
                .map_err(DbError::from)
        })
        .await?;
        Ok(DB::rows_affected(&inserted) == 1)
    }

    pub(super) async fn points(&self, user: &str) -> Result<i64, DbError> {
        Ok(sqlx::query_scalar::<DB, i64>(SUM_POINTS)
            .bind(user)
            .fetch_one(self.pool)
            .await?)
    }
}
