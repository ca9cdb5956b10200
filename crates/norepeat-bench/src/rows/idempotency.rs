//! The `Idempotency-Key` rows, each a request through
//! [`IdempotencyLayer`] (tower `oneshot`, no socket):
//!
//! - `idempotency.claim`: a new key, timed until the handler is entered
//!   (the key checked, the body read and fingerprinted, the in-progress
//!   record written by `SET NX PX GET`). The handlers are held until the
//!   row ends, so nothing but claims runs in the measured window; then they
//!   answer 503 and the layer releases every key.
//! - `idempotency.cycle`: a new key claimed, the handler answering 201 with
//!   a 64-byte JSON body, the record completed, the response read.
//! - `idempotency.replay`: a key whose record is complete: the stored
//!   response replayed.
//! - `idempotency.store_cycle`: the yardstick of `cycle`: the same two
//!   store operations with no layer (a claim by `put_if_absent` of a
//!   12-byte in-progress record, then its completion by
//!   `replace_if_equals` with a 105-byte completed one, the sizes the layer
//!   writes for a 64-byte body), so `cycle / store_cycle` is what the layer
//!   costs on top of its store.
//!
//! `cycle` and `replay` also run on a SQL store (see `sql`), as
//! `idempotency.cycle.postgres` and so on.

use super::super::error::BenchError;
use super::super::harness::{Load, Sample, measure};
use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use norepeat::idempotency::IdempotencyLayer;
use norepeat::keys::{KeyBuilder, Namespace};
use norepeat::store::{AnyStore, KeyValueStore, KeyValueStoreExt};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tower::{Layer, ServiceExt};

/// The 64-byte JSON body the `cycle` handler answers with, and the memory
/// probe stores.
pub(crate) const BODY_64: &[u8; 64] =
    br#"{"paymentId":"p-0000000000000001","status":"PENDING","n":123456}"#;

const REQUEST_BODY: &[u8] = br#"{"orderId":"o1","amount":1999}"#;

/// A `POST /payments` by `bench-user` with `key`.
///
/// Built from parts already parsed (the names, the path, the static
/// values) and the key's bytes as they are: a server hands the layer a
/// request it has parsed once, and this row measures the layer, not
/// `http`'s request builder (which parsed every name and value again, a
/// tenth of a cycle's instructions before).
pub(crate) fn payment(key: String) -> Result<Request<Full<Bytes>>, BenchError> {
    const X_USER_ID: HeaderName = HeaderName::from_static("x-user-id");
    const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
    let key = HeaderValue::from_maybe_shared(Bytes::from(key))
        .map_err(|e| BenchError::unexpected("idempotency", e.to_string()))?;
    let mut req = Request::new(Full::new(Bytes::from_static(REQUEST_BODY)));
    *req.method_mut() = Method::POST;
    *req.uri_mut() = Uri::from_static("/payments");
    let headers = req.headers_mut();
    headers.reserve(3);
    headers.insert(X_USER_ID, HeaderValue::from_static("bench-user"));
    headers.insert(IDEMPOTENCY_KEY, key);
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(req)
}

/// A 201 with [`BODY_64`].
pub(crate) fn created() -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(Bytes::from_static(BODY_64)));
    *res.status_mut() = StatusCode::CREATED;
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    res
}

/// Rides in a request's extensions: the handler says when it is entered,
/// then waits to be let go.
#[derive(Clone)]
pub(crate) struct Held {
    entered: Arc<Mutex<Option<oneshot::Sender<()>>>>,
    go: Arc<Mutex<Option<oneshot::Receiver<()>>>>,
}

/// The driver's side of a [`Held`] request.
pub(crate) struct Holder {
    /// Fires when the handler is entered (errs if it never is).
    pub(crate) entered: oneshot::Receiver<()>,
    /// Lets the handler answer.
    pub(crate) go: oneshot::Sender<()>,
}

impl Held {
    /// A request's side and the driver's.
    pub(crate) fn new() -> (Self, Holder) {
        let (entered_tx, entered) = oneshot::channel();
        let (go, go_rx) = oneshot::channel();
        (
            Self {
                entered: Arc::new(Mutex::new(Some(entered_tx))),
                go: Arc::new(Mutex::new(Some(go_rx))),
            },
            Holder { entered, go },
        )
    }

    async fn enter(&self) {
        let entered = lock(&self.entered).take();
        if let Some(tx) = entered {
            let _ = tx.send(());
        }
        let go = lock(&self.go).take();
        if let Some(rx) = go {
            let _ = rx.await;
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A handler that, for a [`Held`] request, says it was entered and waits
/// to be let go; then answers `then`.
pub(crate) fn held_handler(
    then: fn() -> Response<Full<Bytes>>,
) -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |req: Request<Full<Bytes>>| async move {
        if let Some(h) = req.extensions().get::<Held>() {
            h.enter().await;
        }
        Ok::<_, Infallible>(then())
    })
}

/// A held request on its way: its driver's side and its task.
pub(crate) type Pending = (oneshot::Sender<()>, JoinHandle<StatusCode>);

/// Sends `req` through `svc`; its status.
pub(crate) async fn status_of<S, B>(svc: S, req: Request<Full<Bytes>>) -> StatusCode
where
    S: tower::Service<Request<Full<Bytes>>, Response = Response<B>, Error = Infallible>,
{
    match svc.oneshot(req).await {
        Ok(res) => res.status(),
        Err(never) => match never {},
    }
}

/// Lets held requests go, `window` at a time (all at once would queue
/// every completion on the connections at the same moment, past the
/// client's response timeout), and returns their statuses.
pub(crate) async fn let_go(
    pending: Vec<Pending>,
    window: usize,
) -> Result<Vec<StatusCode>, BenchError> {
    let statuses: Vec<Result<StatusCode, BenchError>> = futures_util::stream::iter(pending)
        .map(|(go, task)| async move {
            let _ = go.send(());
            Ok(task.await?)
        })
        .buffer_unordered(window.max(1))
        .collect()
        .await;
    statuses.into_iter().collect()
}

fn unavailable() -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(Bytes::new()));
    *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    res
}

pub(crate) async fn claim(store: &AnyStore, load: &Load, run: u64) -> Result<Sample, BenchError> {
    // Every claimed handler is held to the row's end: keep the row short
    // enough that they fit in memory.
    let load = Load {
        duration: load.duration.min(Duration::from_secs(2)),
        ..*load
    };
    let svc = IdempotencyLayer::new(store.clone())
        .route("/payments")
        .lease(Duration::from_secs(60))
        .lease_renewal(false)
        // Held to the row's end: thousands at once, past the default bound
        // on detached handlers (which would answer 503 before claiming).
        .max_detached(usize::MAX)
        .layer(held_handler(unavailable));
    let held: Arc<Mutex<Vec<Pending>>> = Arc::new(Mutex::new(Vec::new()));
    let pending = Arc::clone(&held);
    let sample = measure(&load, move |id| {
        let svc = svc.clone();
        let pending = Arc::clone(&pending);
        let req = payment(format!("c{run:x}-{id}")).map(|mut r| {
            let (held, holder) = Held::new();
            r.extensions_mut().insert(held);
            (r, holder)
        });
        async move {
            let (req, holder) = req?;
            let task = tokio::spawn(status_of(svc, req));
            if holder.entered.await.is_err() {
                let status = task.await?;
                return Err(BenchError::unexpected(
                    "idempotency.claim",
                    format!("the handler did not run: {status}"),
                ));
            }
            lock(&pending).push((holder.go, task));
            Ok(())
        }
    })
    .await;
    // The handlers answer 503: the layer releases every key.
    let pending = std::mem::take(&mut *lock(&held));
    let_go(pending, load.concurrency).await?;
    sample
}

pub(crate) async fn cycle(store: &AnyStore, load: &Load, run: u64) -> Result<Sample, BenchError> {
    cycle_on(store, load, run, "idempotency.cycle").await
}

/// `idempotency.cycle` on any key-value store, reported as `row`.
pub(crate) async fn cycle_on<G: KeyValueStore + Clone>(
    store: &G,
    load: &Load,
    run: u64,
    row: &'static str,
) -> Result<Sample, BenchError> {
    let inner =
        tower::service_fn(|_req: Request<Full<Bytes>>| async { Ok::<_, Infallible>(created()) });
    let svc = IdempotencyLayer::new(store.clone())
        .route("/payments")
        // 3 s, as `redis.raw`'s keys (see `probe::Settle`).
        .retention(Duration::from_secs(3))
        .layer(inner);
    measure(load, move |id| {
        let svc = svc.clone();
        let req = payment(format!("y{run:x}-{id}"));
        async move {
            let Ok(res) = svc.oneshot(req?).await;
            if res.status() != StatusCode::CREATED
                || res.headers().contains_key("idempotent-replayed")
            {
                return Err(BenchError::unexpected(
                    row,
                    format!("not a first run: {}", res.status()),
                ));
            }
            let body = res
                .into_body()
                .collect()
                .await
                .map_err(|e| BenchError::unexpected(row, e.to_string()))?;
            std::hint::black_box(body);
            Ok(())
        }
    })
    .await
}

pub(crate) async fn replay(store: &AnyStore, load: &Load, run: u64) -> Result<Sample, BenchError> {
    replay_on(store, load, run, "idempotency.replay").await
}

/// `idempotency.replay` on any key-value store, reported as `row`.
pub(crate) async fn replay_on<G: KeyValueStore + Clone>(
    store: &G,
    load: &Load,
    run: u64,
    row: &'static str,
) -> Result<Sample, BenchError> {
    let inner =
        tower::service_fn(|_req: Request<Full<Bytes>>| async { Ok::<_, Infallible>(created()) });
    let svc = IdempotencyLayer::new(store.clone())
        .route("/payments")
        .retention(Duration::from_secs(120))
        .layer(inner);
    let key = format!("r{run:016x}");
    let Ok(first) = svc.clone().oneshot(payment(key.clone())?).await;
    if first.status() != StatusCode::CREATED {
        return Err(BenchError::unexpected(
            row,
            format!("setup: {}", first.status()),
        ));
    }
    let _ = first.into_body().collect().await;
    measure(load, move |_| {
        let svc = svc.clone();
        let req = payment(key.clone());
        async move {
            let Ok(res) = svc.oneshot(req?).await;
            if res
                .headers()
                .get("idempotent-replayed")
                .map(http::HeaderValue::as_bytes)
                != Some(b"true")
            {
                return Err(BenchError::unexpected(
                    row,
                    format!("not a replay ({})", res.status()),
                ));
            }
            let body = res
                .into_body()
                .collect()
                .await
                .map_err(|e| BenchError::unexpected(row, e.to_string()))?;
            std::hint::black_box(body);
            Ok(())
        }
    })
    .await
}

/// `idempotency.store_cycle`: a claim and its completion at the store, no
/// layer: what `idempotency.cycle` would cost if the layer added nothing.
/// Keys are built as the layer builds them (caller, method, path, client
/// key); the values are the sizes the layer writes.
pub(crate) async fn store_cycle(
    store: &AnyStore,
    load: &Load,
    run: u64,
) -> Result<Sample, BenchError> {
    const ROW: &str = "idempotency.store_cycle";
    // 3 s, as `redis.raw`'s keys (see `probe::Settle`).
    let retention = Duration::from_secs(3);
    let lease = Duration::from_secs(30);
    let keys = KeyBuilder::default();
    let store = store.clone();
    // A completed record of a 201 with `content-type` and `BODY_64`: 105
    // bytes, as the layer writes it.
    let completed: Arc<[u8]> = Arc::from(vec![2u8; 105]);
    measure(load, move |id| {
        let store = store.clone();
        let completed = Arc::clone(&completed);
        let client_key = format!("s{run:x}-{id}");
        let key = keys.key(
            Namespace::Idempotency,
            &[b"bench-user", b"POST", b"/payments", client_key.as_bytes()],
        );
        // 12 bytes unique to the claim, as the layer's in-progress record.
        let mut claim = [3u8, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        claim[4..12].copy_from_slice(&(id ^ run).to_be_bytes());
        async move {
            if let Some(held) = store
                .put_if_absent(&key, &claim, lease)
                .await
                .map_err(|e| BenchError::unexpected(ROW, e.to_string()))?
            {
                return Err(BenchError::unexpected(
                    ROW,
                    format!("a fresh key was held ({} bytes)", held.len()),
                ));
            }
            let done = store
                .replace_if_equals(&key, &claim, &completed, retention)
                .await
                .map_err(|e| BenchError::unexpected(ROW, e.to_string()))?;
            if !done {
                return Err(BenchError::unexpected(
                    ROW,
                    "the completion found another record",
                ));
            }
            Ok(())
        }
    })
    .await
}
