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
//! ```ignore
//! async fn pay(
//!     State(s): State<AppState>,
//!     Extension(idem): Extension<IdempotentTx<PgStore>>,
//!     Json(req): Json<PayRequest>,
//! ) -> Result<Response, ApiError> {
//!     let mut tx = s.pool.begin().await?;
//!     let payment = insert_payment(&mut tx, &req).await?; // the effect
//!     let res = (StatusCode::CREATED, Json(payment)).into_response();
//!     Ok(idem.commit(tx, res).await?.into_response()) // record + effect, one commit
//! }
//! ```
//!
//! See [transactional completion](crate::store::sql#transactional-completion)
//! for what a crash at each point leaves.

use super::record::{self, Digest, Owner};
use http::HeaderName;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The handle a claimed request carries in its extensions (see the
/// [module docs](self)): commit the handler's transaction together with the
/// completed idempotency record.
///
/// `S` is the layer's store; [`commit`](Self::commit) exists for
/// [`PgStore`](crate::store::PgStore) and
/// [`SqliteStore`](crate::store::SqliteStore). The handle is present only
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
    key: String,
    claimed: Vec<u8>,
    owner: Owner,
    fingerprint: Digest,
    retention: Duration,
    replayed_headers: Arc<[HeaderName]>,
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
    pub(crate) fn new(
        store: S,
        key: &str,
        owner: &Owner,
        fingerprint: &Digest,
        retention: Duration,
        replayed_headers: Arc<[HeaderName]>,
        max_body: usize,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                key: key.to_owned(),
                claimed: record::in_progress(owner, fingerprint),
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

/// Why [`IdempotentTx::commit`] did not commit.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TxError {
    /// The claim is no longer this request's (its lease ran out, and maybe
    /// another request took the key over). The transaction was rolled back:
    /// the effect did not happen. Answer with a 5xx (or 409); a retry gets
    /// the other request's answer or runs again.
    #[error("the idempotency claim was lost before commit; the transaction was rolled back")]
    Lost,
    /// The response body could not be read whole, or is larger than the
    /// layer's [`max_body`](super::IdempotencyLayer::max_body). Rolled back.
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
    use http_body_util::{BodyExt, Full, Limited};
    use std::sync::atomic::Ordering;

    macro_rules! impl_commit {
        ($db:ty) => {
            impl IdempotentTx<SqlStore<$db>> {
                /// Writes the completed record for `response` into `tx`
                /// (owner-checked: the claim must still be this request's
                /// and unexpired), then commits `tx`. Returns the response,
                /// its body read whole: the same bytes a replay will send.
                ///
                /// The record is written whatever the status, since the
                /// handler chose to commit its effect with it. An error
                /// path that commits nothing simply returns its response;
                /// the layer then stores or releases as usual.
                ///
                /// # Errors
                /// [`TxError::Lost`] when the claim is no longer ours,
                /// [`TxError::Body`] for a body over the cap or broken (both
                /// roll back), [`TxError::Database`] when the database
                /// fails.
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
                    let body = Limited::new(body, i.max_body)
                        .collect()
                        .await
                        .map_err(|e| TxError::Body(e.to_string()))?
                        .to_bytes();
                    let headers = head
                        .headers
                        .iter()
                        .filter(|(n, _)| i.replayed_headers.contains(n));
                    let done =
                        record::completed(&i.owner, &i.fingerprint, head.status, headers, &body);
                    let ours = i
                        .store
                        .replace_if_equals_in(&mut tx, &i.key, &i.claimed, &done, i.retention)
                        .await?;
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
