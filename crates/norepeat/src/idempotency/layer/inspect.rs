//! An operator's look at one key's record, and its clearing: how an
//! `idempotency_outcome_unknown` is resolved once someone has checked what
//! the backend did.

use super::IdempotencyLayer;
use crate::idempotency::record;
use crate::keys::Namespace;
use crate::store::{KeyValueStore, KeyValueStoreExt, ReadStoreExt, StoreError};
use bytes::Bytes;
use http::{Method, StatusCode};

/// One key's record, as an operator reads it
/// ([`IdempotencyLayer::inspect`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordState {
    /// A request holds the key: attempt `attempt`, its lease still running
    /// (or a record of an older release, which keeps no lease).
    InProgress {
        /// 1 for the first claim, one more at each take-over.
        attempt: u8,
    },
    /// A request held the key and its lease passed with no renewal: the
    /// process that ran it is gone, and the outcome is unknown.
    Abandoned {
        /// The attempt that was abandoned.
        attempt: u8,
    },
    /// Released: attempt `attempt` ended with nothing kept (a 5xx the
    /// policy does not store); the key's next request runs, as attempt
    /// `attempt + 1`.
    Released {
        /// The attempt that was released.
        attempt: u8,
    },
    /// Attempt `attempt` ended with an outcome nobody knows (it timed out:
    /// see [`OutcomeUnknown`](super::OutcomeUnknown)); its client was told
    /// `status`. Every repeat is refused until the record is cleared or its
    /// retention ends.
    OutcomeUnknown {
        /// The attempt whose outcome is unknown.
        attempt: u8,
        /// The status its client got (a 504, or the backend's own 500).
        status: StatusCode,
    },
    /// Completed: a retry gets this answer replayed.
    Completed {
        /// The stored status.
        status: StatusCode,
        /// Its stored headers, by name (the values are the backend's and
        /// are not shown).
        headers: Vec<String>,
        /// The stored body's length in bytes.
        body_len: usize,
    },
}

/// A record read by [`IdempotencyLayer::inspect`]: its state, and the bytes
/// [`IdempotencyLayer::clear`] deletes only if they are still there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inspected {
    /// What the record says.
    pub state: RecordState,
    bytes: Bytes,
}

impl<G: KeyValueStore + Clone> IdempotencyLayer<G> {
    /// The record of the request `method path` with key `key` from
    /// `caller` (the id the layer's [`Identify`](crate::identity::Identify)
    /// gives that caller, and the path as the client sent it: under
    /// axum's `Router::nest`, with the nest's prefix, as
    /// [`client_path`](crate::request::client_path) gives it), or `None`
    /// when there is none. A read: it changes nothing.
    ///
    /// ```
    /// use norepeat::idempotency::{IdempotencyLayer, RecordState};
    /// use norepeat::store::MemoryStore;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = IdempotencyLayer::new(MemoryStore::default());
    /// assert_eq!(layer.inspect("u1", &http::Method::POST, "/payments", "k1").await?, None);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The store failed, or the record is not one this version can read.
    pub async fn inspect(
        &self,
        caller: &str,
        method: &Method,
        path: &str,
        key: &str,
    ) -> Result<Option<Inspected>, StoreError> {
        let Some(bytes) = self
            .guard
            .store
            .get(&self.record_key(caller, method, path, key))
            .await?
        else {
            return Ok(None);
        };
        let rec = record::decode(&bytes).map_err(|e| StoreError::Protocol(e.to_string()))?;
        let state = match (rec.completed, rec.lease) {
            (None, Some(lease)) if rec.unknown.is_some() => RecordState::OutcomeUnknown {
                attempt: lease.attempt,
                status: rec.unknown.unwrap_or(StatusCode::GATEWAY_TIMEOUT),
            },
            (None, Some(lease)) if rec.released => RecordState::Released {
                attempt: lease.attempt,
            },
            (Some(c), _) => RecordState::Completed {
                status: c.status,
                headers: c
                    .headers
                    .iter()
                    .map(|(n, _)| n.as_str().to_owned())
                    .collect(),
                body_len: c.body.len(),
            },
            (None, Some(lease))
                if crate::claim::passed(lease.deadline, crate::clock::now_ms(), 0) =>
            {
                RecordState::Abandoned {
                    attempt: lease.attempt,
                }
            }
            (None, lease) => RecordState::InProgress {
                attempt: lease.map_or(1, |l| l.attempt),
            },
        };
        Ok(Some(Inspected { state, bytes }))
    }

    /// Deletes the record `inspected` was read from, only if it still holds
    /// the very bytes read (one owner-checked delete): a record that
    /// changed since (completed, renewed, taken over) stays, and `false`
    /// says so. The key is then free: its next request runs.
    ///
    /// ```
    /// use norepeat::idempotency::IdempotencyLayer;
    /// use norepeat::store::MemoryStore;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = IdempotencyLayer::new(MemoryStore::default());
    /// if let Some(r) = layer.inspect("u1", &http::Method::POST, "/payments", "k1").await? {
    ///     layer.clear("u1", &http::Method::POST, "/payments", "k1", &r).await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The store failed.
    pub async fn clear(
        &self,
        caller: &str,
        method: &Method,
        path: &str,
        key: &str,
        inspected: &Inspected,
    ) -> Result<bool, StoreError> {
        let at = self.record_key(caller, method, path, key);
        self.guard
            .store
            .delete_if_equals(&at, &inspected.bytes)
            .await
    }

    /// Where the layer keeps the record of `method path` keyed `key` for
    /// `caller`: the key `handle` claims.
    pub(super) fn record_key(
        &self,
        caller: &str,
        method: &Method,
        path: &str,
        key: &str,
    ) -> String {
        self.keys.key(
            Namespace::Idempotency,
            &[
                caller.as_bytes(),
                method.as_str().as_bytes(),
                path.as_bytes(),
                key.as_bytes(),
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;
    use http_body_util::Full;
    use std::convert::Infallible;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::{Layer, ServiceExt};

    #[tokio::test]
    async fn a_record_is_read_cleared_owner_checked_and_its_key_runs_again() {
        let layer = IdempotencyLayer::new(MemoryStore::default());
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&runs);
        let svc = layer.layer(tower::service_fn(
            move |_req: http::Request<Full<Bytes>>| {
                counted.fetch_add(1, Ordering::SeqCst);
                async move {
                    Ok::<_, Infallible>(
                        http::Response::builder()
                            .status(201)
                            .header("content-type", "text/plain")
                            .body(Full::new(Bytes::from_static(b"paid")))
                            .expect("a response"),
                    )
                }
            },
        ));
        let req = || {
            http::Request::post("/payments")
                .header("x-user-id", "u1")
                .header("idempotency-key", "k1")
                .body(Full::new(Bytes::new()))
                .expect("a request")
        };
        let inspect = || layer.inspect("u1", &Method::POST, "/payments", "k1");
        assert_eq!(inspect().await.expect("read"), None);
        svc.clone().oneshot(req()).await.expect("served");
        let read = inspect().await.expect("read").expect("a record");
        assert_eq!(
            read.state,
            RecordState::Completed {
                status: StatusCode::CREATED,
                headers: vec!["content-type".into()],
                body_len: 4,
            }
        );
        assert_eq!(
            layer
                .inspect("u2", &Method::POST, "/payments", "k1")
                .await
                .expect("read"),
            None,
            "another caller's"
        );
        // A replay does not run it again; a clear of stale bytes clears nothing.
        svc.clone().oneshot(req()).await.expect("replayed");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        let stale = Inspected {
            state: read.state.clone(),
            bytes: Bytes::from_static(b"other bytes"),
        };
        assert!(
            !layer
                .clear("u1", &Method::POST, "/payments", "k1", &stale)
                .await
                .expect("store")
        );
        assert!(
            layer
                .clear("u1", &Method::POST, "/payments", "k1", &read)
                .await
                .expect("store")
        );
        assert_eq!(inspect().await.expect("read"), None);
        svc.oneshot(req()).await.expect("served");
        assert_eq!(runs.load(Ordering::SeqCst), 2, "the cleared key runs again");
    }
}

#[cfg(test)]
mod previous {
    use super::*;
    use crate::identity::UserHeader;
    use crate::store::MemoryStore;
    use http_body_util::Full;
    use std::convert::Infallible;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::{Layer, ServiceExt};

    /// A changed identity (here from `X-User-Id` to `X-Account`) keeps the
    /// records made under the old one: their retries are replayed, never
    /// run again. Before `previous_identity`, the change made every key new
    /// and the retry ran the payment a second time.
    #[tokio::test]
    async fn a_retry_across_an_identity_change_is_replayed_not_run() {
        let store = MemoryStore::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let handler = |runs: Arc<AtomicUsize>| {
            tower::service_fn(move |_req: http::Request<Full<Bytes>>| {
                runs.fetch_add(1, Ordering::SeqCst);
                async {
                    Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"paid"))))
                }
            })
        };
        let req = |key: &str| {
            http::Request::post("/payments")
                .header("x-user-id", "u1")
                .header("x-account", "acct-1")
                .header("idempotency-key", key)
                .body(Full::new(Bytes::new()))
                .expect("a request")
        };
        let before = IdempotencyLayer::new(store.clone()).layer(handler(Arc::clone(&runs)));
        before.oneshot(req("k1")).await.expect("served");
        let now = IdempotencyLayer::new(store.clone())
            .identity(UserHeader::new(http::HeaderName::from_static("x-account")))
            .previous_identity(UserHeader::default());
        let after = now.clone().layer(handler(Arc::clone(&runs)));
        let retry = after.clone().oneshot(req("k1")).await.expect("served");
        assert_eq!(retry.headers()["idempotent-replayed"], "true");
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "run again across the change"
        );
        // A new key is the new identity's.
        after.oneshot(req("k2")).await.expect("served");
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        let under_new = now
            .inspect("acct-1", &Method::POST, "/payments", "k2")
            .await;
        assert!(under_new.expect("read").is_some());
        let under_old = now.inspect("u1", &Method::POST, "/payments", "k2").await;
        assert_eq!(under_old.expect("read"), None);
    }
}
