//! Transactional completion: the handler's writes and the completed record
//! commit in one database transaction.
//!
//! Once the [`IdempotencyLayer`](super::IdempotencyLayer) has claimed a key,
//! it puts an [`IdempotentTx`] into the request's extensions. A handler on a
//! [`SqlStore`](crate::store::SqlStore) takes it (axum's `Extension`
//! extractor), opens a transaction on the store's database, makes its
//! writes, builds its response and hands both to
//! [`IdempotentTx::commit`]. That writes the completed record (status,
//! replayed headers, body: what the layer would store) inside the same
//! transaction, owner-checked, then commits. The layer sees the record
//! already completed and leaves it alone.
//!
//! The example is on [`IdempotentTx`].
//!
//! See [transactional completion](crate::store::sql#transactional-completion)
//! for what a crash at each point leaves.

use super::policy::StoredHeaders;
use super::record::{Digest, Owner};
use crate::claim::Fence;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The handle a claimed request carries in its extensions: commit the
/// handler's transaction together with the completed idempotency record.
///
/// The handler takes it with axum's `Extension` extractor, makes its writes
/// in a transaction on the store's database, builds its response, and gives
/// both to `commit`. The payment row and the record that
/// replays its answer then exist together or not at all.
///
#[cfg_attr(feature = "sqlite", doc = "```")]
#[cfg_attr(not(feature = "sqlite"), doc = "```ignore")]
/// use axum::{Extension, Router, body::Body, extract::State, routing::post};
/// use axum::response::{IntoResponse, Response};
/// use http::{Request, StatusCode};
/// use norepeat::idempotency::{IdempotencyLayer, IdempotentTx, TxError};
/// use norepeat::store::SqliteStore;
/// use sqlx::SqlitePool;
/// use tower::ServiceExt;
///
/// async fn pay(
///     State(pool): State<SqlitePool>,
///     Extension(idem): Extension<IdempotentTx<SqliteStore>>,
///     body: String,
/// ) -> Response {
///     let mut tx = pool.begin().await.unwrap();
///     sqlx::query("INSERT INTO payments (body) VALUES ($1)") // the effect
///         .bind(&body)
///         .execute(&mut *tx)
///         .await
///         .unwrap();
///     let res = (StatusCode::CREATED, "paid").into_response();
///     // The completed record joins the transaction (owner-checked), then
///     // one COMMIT makes both durable.
///     match idem.commit(tx, res).await {
///         Ok(res) => res.into_response(),
///         Err(TxError::Lost) => StatusCode::CONFLICT.into_response(), // rolled back
///         Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),  // rolled back or unknown, never half
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::sqlite::SqlitePoolOptions::new()
///     .max_connections(1) // every connection to `sqlite::memory:` is its own database
///     .connect("sqlite::memory:")
///     .await?;
/// sqlx::query("CREATE TABLE payments (body TEXT)").execute(&pool).await?;
/// let store = SqliteStore::new(pool.clone());
/// store.migrate().await?;
/// let app = Router::new()
///     .route("/pay", post(pay).layer(IdempotencyLayer::new(store).route("/pay")))
///     .with_state(pool.clone());
/// let req = || {
///     Request::post("/pay")
///         .header("x-user-id", "u1")
///         .header("idempotency-key", "k1")
///         .body(Body::from("1999"))
///         .unwrap()
/// };
/// assert_eq!(app.clone().oneshot(req()).await?.status(), StatusCode::CREATED);
/// let replay = app.oneshot(req()).await?;
/// assert_eq!(replay.headers()["idempotent-replayed"], "true");
/// let paid: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM payments").fetch_one(&pool).await?;
/// assert_eq!(paid, 1);
/// # Ok(()) }
/// ```
///
/// `S` is the layer's store; `commit` exists for `PgStore` and
/// `SqliteStore` (features `postgres`, `sqlite`). The handle is present only
/// once the layer has claimed the key: a route that fails open
/// ([`FailurePolicy::FailOpen`](crate::degrade::FailurePolicy)) and runs
/// unguarded while the store is down gets none, so take it there as an
/// `Option<Extension<IdempotentTx<S>>>`.
pub struct IdempotentTx<S> {
    inner: Arc<Inner<S>>,
}

// Fields read only by the SQL stores' `commit`.
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
struct Inner<S> {
    store: S,
    key: Arc<str>,
    /// The claim's in-progress record (as its renewals rewrite it): the
    /// fence of the completion.
    fence: Arc<Fence>,
    owner: Owner,
    fingerprint: Digest,
    retention: Duration,
    replayed_headers: StoredHeaders,
    max_body: usize,
    committed: AtomicBool,
}

impl<S> Clone for IdempotentTx<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S> std::fmt::Debug for IdempotentTx<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotentTx")
            .field("committed", &self.committed())
            .finish_non_exhaustive()
    }
}

impl<S> IdempotentTx<S> {
    #[allow(clippy::too_many_arguments)]
    /// The offer of the claim whose key is `key` and whose value (the
    /// in-progress record of `owner` and `fingerprint`) `fence` holds:
    /// shared with the claim, not copied.
    pub(crate) fn new(
        store: S,
        key: Arc<str>,
        fence: Arc<Fence>,
        owner: &Owner,
        fingerprint: &Digest,
        retention: Duration,
        replayed_headers: StoredHeaders,
        max_body: usize,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                key,
                fence,
                owner: *owner,
                fingerprint: *fingerprint,
                retention,
                replayed_headers,
                max_body,
                committed: AtomicBool::new(false),
            }),
        }
    }

    /// Whether a transaction carrying the completed record has committed.
    #[must_use]
    pub fn committed(&self) -> bool {
        self.inner.committed.load(Ordering::Acquire)
    }
}

/// Why `IdempotentTx::commit` did not commit.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TxError {
    /// The claim is no longer this request's (its lease ran out, and maybe
    /// another request took the key over). The transaction was rolled back:
    /// the effect did not happen. Answer with a 5xx (or 409); a retry gets
    /// the other request's answer or runs again.
    #[error("the idempotency claim was lost before commit; the transaction was rolled back")]
    Lost,
    /// The response body broke off while it was read. Rolled back. (A
    /// body larger than the layer's
    /// [`max_body`](super::IdempotencyLayer::max_body) is committed, its
    /// record without it: a replay answers `Idempotent-Body: omitted`.)
    #[error("the response cannot be stored: {0}")]
    Body(String),
    /// The database failed. Before `COMMIT` was sent the transaction is
    /// rolled back; if `COMMIT` itself failed its outcome is unknown, but
    /// the effect and the completed record share it, so either both exist
    /// or neither does.
    #[error("database: {0}")]
    Database(#[from] crate::store::StoreError),
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod sql {
    use super::{IdempotentTx, TxError};
    use crate::idempotency::record;
    use crate::store::SqlStore;
    use bytes::Bytes;
    use http::Response;
    use http_body::Body;
    use http_body_util::{BodyExt, Full};
    use std::sync::atomic::Ordering;

    macro_rules! impl_commit {
        ($db:ty) => {
            impl IdempotentTx<SqlStore<$db>> {
                /// Writes the completed record for `response` into `tx`
                /// (owner-checked: the claim must still be this request's
                /// and unexpired), then commits `tx`. Returns the response,
                /// its body read whole: the same bytes a replay will send,
                /// unless the body is over the layer's `max_body` (a replay
                /// then sends the status, an empty body and
                /// `Idempotent-Body: omitted`).
                ///
                /// The record is written whatever the status, since the
                /// handler chose to commit its effect with it. An error
                /// path that commits nothing simply returns its response;
                /// the layer then stores or releases as usual.
                ///
                /// # Errors
                /// [`TxError::Lost`] when the claim is no longer ours,
                /// [`TxError::Body`] for a body that broke (rolled back),
                /// [`TxError::Database`] when the database fails.
                pub async fn commit<'c, B>(
                    &self,
                    mut tx: sqlx::Transaction<'c, $db>,
                    response: Response<B>,
                ) -> Result<Response<Full<Bytes>>, TxError>
                where
                    B: Body<Data = Bytes>,
                    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
                {
                    let i = &self.inner;
                    let (head, body) = response.into_parts();
                    // Read whole: it is the handler's answer, made in
                    // memory, and the client gets it whole. Over the cap it
                    // is not stored: the record keeps the outcome without
                    // it, as the layer does (`Idempotent-Body: omitted`).
                    let body = body
                        .collect()
                        .await
                        .map_err(|e| TxError::Body(e.into().to_string()))?
                        .to_bytes();
                    let headers = i.replayed_headers.select(&head.headers);
                    let done = if body.len() <= i.max_body {
                        record::completed(&i.owner, &i.fingerprint, head.status, headers, &body)
                    } else {
                        record::completed_without_body(
                            &i.owner,
                            &i.fingerprint,
                            head.status,
                            headers,
                        )
                    };
                    // Held to the commit: no renewal rewrites the record
                    // between this check and the commit.
                    let fence = i.fence.lock().await;
                    let mut ours = false;
                    for claimed in fence.newest_first() {
                        if i.store
                            .replace_if_equals_in(&mut tx, &i.key, claimed, &done, i.retention)
                            .await?
                        {
                            ours = true;
                            break;
                        }
                    }
                    if !ours {
                        // Dropping `tx` would roll back too; say it.
                        let _ = tx.rollback().await;
                        metrics::counter!("norepeat_idempotency_stale_completions_total")
                            .increment(1);
                        return Err(TxError::Lost);
                    }
                    tx.commit()
                        .await
                        .map_err(|e| TxError::Database(i.store.err(e)))?;
                    drop(fence);
                    i.committed.store(true, Ordering::Release);
                    Ok(Response::from_parts(head, Full::new(body)))
                }
            }
        };
    }

    #[cfg(feature = "postgres")]
    impl_commit!(sqlx::Postgres);
    #[cfg(feature = "sqlite")]
    impl_commit!(sqlx::Sqlite);
}
