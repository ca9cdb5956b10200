//! Once mode in one database transaction: the body's writes and its stored
//! result commit together.

use super::once::{Claimed, encode};
use super::{Guarded, Rejected};
use crate::claim::Renewal;
use crate::idempotency::Abandoned;
use crate::store::StoreError;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::future::Future;

/// Once mode with the body's writes and the stored result in one database
/// transaction: a message consumer that awards points and records the
/// message together.
impl Guarded {
    /// Once mode on a SQL store ([`PgStore`](crate::store::PgStore),
    /// [`SqliteStore`](crate::store::SqliteStore)): claims the key, opens a
    /// transaction on the store's pool and hands it to `body`, which makes
    /// its writes and gives the transaction back with its result. The
    /// stored result is then written in that transaction, owner-checked
    /// (the claim must still be this call's), and one `COMMIT` makes the
    /// writes and the record durable together. A crash or a dropped future
    /// before the commit leaves no writes and the claim open: once its
    /// lease has passed, the next delivery takes it over and runs once (the
    /// abandoned call ran no effect, so here an abandoned claim is retried
    /// unless [`abandoned`](Self::abandoned) says otherwise); after it, both.
    ///
    /// # Errors
    /// The body's error (its transaction is dropped, so rolled back, and
    /// the key is free again), or `E::from(`[`Rejected`]`)`: `InProgress`
    /// while another call holds the key, or when this call's claim was lost
    /// before the commit (its writes were rolled back; the other call's
    /// result stands); `Unavailable` when the database fails (the claim is
    /// released; if `COMMIT` itself failed, the writes and the record share
    /// its fate); `Unreadable` as in [`run_once`](Self::run_once).
    ///
    /// ```
    /// use norepeat::attribute::{Guarded, Rejected};
    /// use norepeat::store::SqliteStore;
    /// # #[derive(Debug)] struct E;
    /// # impl From<Rejected> for E { fn from(_: Rejected) -> Self { E } }
    /// # impl From<sqlx::Error> for E { fn from(_: sqlx::Error) -> Self { E } }
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), E> {
    /// let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await?;
    /// sqlx::query("CREATE TABLE points (user_id TEXT, n INTEGER)").execute(&pool).await?;
    /// let store = SqliteStore::new(pool.clone());
    /// store.migrate().await.map_err(|_| E)?;
    /// let once = Guarded::once("points::award");
    /// for _delivery in 0..3 {
    ///     let awarded: i64 = once
    ///         .run_once_in_tx(&store, "order-7", |mut tx| async move {
    ///             sqlx::query("INSERT INTO points VALUES ('u1', 30)").execute(&mut *tx).await?;
    ///             Ok::<_, E>((tx, 30))
    ///         })
    ///         .await?;
    ///     assert_eq!(awarded, 30);
    /// }
    /// let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM points").fetch_one(&pool).await?;
    /// assert_eq!(rows, 1);
    /// # Ok(()) }
    /// ```
    pub async fn run_once_in_tx<S, T, E, F, Fut>(
        &self,
        store: &S,
        key: &str,
        body: F,
    ) -> Result<T, E>
    where
        S: crate::store::sql::TxStore,
        T: Serialize + DeserializeOwned,
        E: From<Rejected>,
        F: FnOnce(sqlx::Transaction<'static, S::Database>) -> Fut,
        Fut: Future<Output = Result<(sqlx::Transaction<'static, S::Database>, T), E>>,
    {
        let (retention, lease) = self.times();
        let abandoned = self.abandoned.unwrap_or(Abandoned::Retry);
        let claim = match self
            .claim::<S, T>(store, key, abandoned)
            .await
            .map_err(E::from)?
        {
            Claimed::Owned(claim) => claim,
            Claimed::Done(v) => return Ok(v),
            Claimed::Unguarded => {
                // Fail open: run unguarded, committing the body's writes.
                let tx = store
                    .begin_tx()
                    .await
                    .map_err(|e| E::from(Rejected::from(e)))?;
                let (tx, v) = body(tx).await?;
                store
                    .commit_tx(tx)
                    .await
                    .map_err(|e| E::from(Rejected::from(e)))?;
                return Ok(v);
            }
        };
        let unavailable = |e: StoreError| E::from(Rejected::from(e));
        let work = async {
            let tx = store.begin_tx().await.map_err(unavailable)?;
            body(tx).await
        };
        let (mut tx, v) = match claim.run(work, Renewal::thirds(lease)).await {
            Ok(out) => out,
            Err(e) => {
                claim.release().await;
                return Err(e);
            }
        };
        let Some(Ok(done)) = encode(Some(&v)) else {
            tracing::warn!(
                key = claim.key(),
                "once: the result does not serialize; rolling back"
            );
            drop(tx);
            claim.release().await;
            return Err(E::from(Rejected::Unreadable(
                "the result does not serialize".into(),
            )));
        };
        // Held to the commit: no renewal rewrites the claim in between.
        let fence = claim.fence();
        let values = fence.lock().await;
        let mut replaced = Ok(false);
        for claimed in values.newest_first() {
            replaced = store
                .replace_in_tx(&mut tx, claim.key(), claimed, &done, retention)
                .await;
            if !matches!(replaced, Ok(false)) {
                break;
            }
        }
        match replaced {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(
                    key = claim.key(),
                    "once: claim lost before commit; rolled back"
                );
                drop((tx, values));
                claim.keep();
                return Err(E::from(Rejected::InProgress));
            }
            Err(e) => {
                drop((tx, values));
                claim.release().await;
                return Err(unavailable(e));
            }
        }
        let committed = store.commit_tx(tx).await;
        drop(values);
        match committed {
            Ok(()) => {
                claim.keep();
                Ok(v)
            }
            Err(e) => {
                // Owner-checked: frees the key only if the commit did not
                // happen (the record would no longer be our claim).
                claim.release().await;
                Err(unavailable(e))
            }
        }
    }
}

/// The store of a `#[norepeat::guard(tx = ...)]` function, checked to be a
/// SQL store where the attribute names it (the macro calls this; not for
/// direct use). A store that is not gets the error there, pointing at
/// `store = ...`; the uses after it see a `TxStore` and add at most one more
/// of the same error.
#[doc(hidden)]
pub fn tx_store<S: crate::store::sql::TxStore>(
    store: S,
) -> impl crate::store::sql::TxStore<Database = S::Database> {
    store
}
