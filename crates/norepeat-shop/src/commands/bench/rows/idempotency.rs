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

use super::super::BenchError;
use super::super::harness::{Load, Sample, measure};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use norepeat::idempotency::IdempotencyLayer;
use norepeat::store::AnyStore;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{oneshot, watch};
use tower::{Layer, ServiceExt};

/// The 64-byte JSON body the `cycle` handler answers with, and the memory
/// probe stores.
pub(crate) const BODY_64: &[u8; 64] =
    br#"{"paymentId":"p-0000000000000001","status":"PENDING","n":123456}"#;

const REQUEST_BODY: &[u8] = br#"{"orderId":"o1","amount":1999}"#;

/// A `POST /payments` by `bench-user` with `key`.
pub(crate) fn payment(key: &str) -> Result<Request<Full<Bytes>>, BenchError> {
    Request::post("/payments")
        .header("x-user-id", "bench-user")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(REQUEST_BODY)))
        .map_err(|e| BenchError::unexpected("idempotency", e.to_string()))
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

/// Rides in a request's extensions; the handler fires it when entered.
#[derive(Clone, Default)]
pub(crate) struct Entered(Arc<Mutex<Option<oneshot::Sender<()>>>>);

impl Entered {
    /// A signal and the receiver that hears it.
    pub(crate) fn new() -> (Self, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        (Self(Arc::new(Mutex::new(Some(tx)))), rx)
    }

    /// Says the handler runs.
    pub(crate) fn fire(&self) {
        let tx = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(tx) = tx {
            let _ = tx.send(());
        }
    }
}

/// A handler that says it was entered, waits until `go` turns true, and
/// answers `then`.
pub(crate) fn held_handler(
    go: watch::Receiver<bool>,
    then: fn() -> Response<Full<Bytes>>,
) -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |req: Request<Full<Bytes>>| {
        let mut go = go.clone();
        async move {
            if let Some(e) = req.extensions().get::<Entered>() {
                e.fire();
            }
            let _ = go.wait_for(|g| *g).await;
            Ok::<_, Infallible>(then())
        }
    })
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
    let (go_tx, go) = watch::channel(false);
    let svc = IdempotencyLayer::new(store.clone())
        .route("/payments")
        .lease(Duration::from_secs(60))
        .lease_renewal(false)
        .layer(held_handler(go, unavailable));
    let held = Arc::new(Mutex::new(Vec::new()));
    let tasks = Arc::clone(&held);
    let sample = measure(&load, move |id| {
        let svc = svc.clone();
        let tasks = Arc::clone(&tasks);
        let req = payment(&format!("c{run:x}-{id}")).map(|mut r| {
            let (entered, rx) = Entered::new();
            r.extensions_mut().insert(entered);
            (r, rx)
        });
        async move {
            let (req, rx) = req?;
            let task = tokio::spawn(svc.oneshot(req));
            if rx.await.is_err() {
                let Ok(res) = task.await?;
                return Err(BenchError::unexpected(
                    "idempotency.claim",
                    format!("the handler did not run: {}", res.status()),
                ));
            }
            tasks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(task);
            Ok(())
        }
    })
    .await;
    let _ = go_tx.send(true);
    let tasks = std::mem::take(
        &mut *held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    for t in tasks {
        let _ = t.await?;
    }
    sample
}

pub(crate) async fn cycle(store: &AnyStore, load: &Load, run: u64) -> Result<Sample, BenchError> {
    let inner =
        tower::service_fn(|_req: Request<Full<Bytes>>| async { Ok::<_, Infallible>(created()) });
    let svc = IdempotencyLayer::new(store.clone())
        .route("/payments")
        .retention(Duration::from_secs(30))
        .layer(inner);
    measure(load, move |id| {
        let svc = svc.clone();
        let req = payment(&format!("y{run:x}-{id}"));
        async move {
            let Ok(res) = svc.oneshot(req?).await;
            if res.status() != StatusCode::CREATED
                || res.headers().contains_key("idempotent-replayed")
            {
                return Err(BenchError::unexpected(
                    "idempotency.cycle",
                    format!("not a first run: {}", res.status()),
                ));
            }
            let body = res
                .into_body()
                .collect()
                .await
                .map_err(|e| BenchError::unexpected("idempotency.cycle", e.to_string()))?;
            std::hint::black_box(body);
            Ok(())
        }
    })
    .await
}

pub(crate) async fn replay(store: &AnyStore, load: &Load, run: u64) -> Result<Sample, BenchError> {
    let inner =
        tower::service_fn(|_req: Request<Full<Bytes>>| async { Ok::<_, Infallible>(created()) });
    let svc = IdempotencyLayer::new(store.clone())
        .route("/payments")
        .retention(Duration::from_secs(120))
        .layer(inner);
    let key = format!("r{run:016x}");
    let Ok(first) = svc.clone().oneshot(payment(&key)?).await;
    if first.status() != StatusCode::CREATED {
        return Err(BenchError::unexpected(
            "idempotency.replay",
            format!("setup: {}", first.status()),
        ));
    }
    let _ = first.into_body().collect().await;
    measure(load, move |_| {
        let svc = svc.clone();
        let req = payment(&key);
        async move {
            let Ok(res) = svc.oneshot(req?).await;
            if res
                .headers()
                .get("idempotent-replayed")
                .map(http::HeaderValue::as_bytes)
                != Some(b"true")
            {
                return Err(BenchError::unexpected(
                    "idempotency.replay",
                    format!("not a replay ({})", res.status()),
                ));
            }
            let body = res
                .into_body()
                .collect()
                .await
                .map_err(|e| BenchError::unexpected("idempotency.replay", e.to_string()))?;
            std::hint::black_box(body);
            Ok(())
        }
    })
    .await
}
