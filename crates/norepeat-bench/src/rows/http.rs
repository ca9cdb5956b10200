//! `http.unguarded`, `http.guarded` and `http.handrolled`: `POST /orders`
//! over loopback to a trivial axum route (reads the body, answers 201),
//! without a guard, behind the fingerprint guard, and with the guard the
//! article's engineers wrote by hand in the handler, driven
//! by one keep-alive reqwest client from every task, each request a new
//! body (so each guarded one is a new fingerprint).
//!
//! The hand-written guard: a key from the caller and a hash of the raw
//! body, `SET key 1 NX PX 3000` through plain redis-rs on as many
//! `ConnectionManager`s as the store holds (each key on one of them), 409
//! when the key is taken. On the memory store, the same by hand in
//! process: a `Mutex<HashMap>` from key to expiry, a taken key one whose
//! expiry has not passed. (The article's code deletes the key again when
//! the work fails; ours never fails, so that path is left out.) No canonical JSON, no owner, no fail-open policy, no
//! metrics: `http.guarded / http.handrolled` is what the layer costs over
//! writing it yourself.

use super::super::error::BenchError;
use super::super::harness::{Load, Sample, measure};
use axum::Router;
use axum::extract::State;
use axum::routing::post;
use bytes::Bytes;
use http::StatusCode;
use norepeat::fingerprint::{FingerprintGuard, FingerprintLayer};
use norepeat::store::AnyStore;
use redis::aio::ConnectionManager;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

async fn created(_body: Bytes) -> (StatusCode, &'static str) {
    (StatusCode::CREATED, r#"{"created":true}"#)
}

/// Which guard the route has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Guard {
    /// None.
    Unguarded,
    /// [`FingerprintLayer`] on the bench's store.
    Layer,
    /// `SET NX PX` in the handler, through plain redis-rs (on the memory
    /// store, a map by hand).
    HandRolled,
}

/// Where the hand-written guard keeps its keys.
#[derive(Clone)]
enum HandRolled {
    /// Plain redis-rs connections, as many as the store holds, each key
    /// on one of them (as the store places its keys).
    Redis(Arc<[ConnectionManager]>),
    /// In process: each key and when it expires.
    Memory(Arc<Mutex<HashMap<[u8; 16], Instant>>>),
}

/// How long the hand-written guard holds a key: `PX 3000`.
const HELD: Duration = Duration::from_secs(3);

/// The article's guard, by hand: the caller and a hash of the raw body as
/// the key, `SET NX PX` for 3 s, 409 when taken.
async fn handrolled(
    State(cx): State<HandRolled>,
    headers: http::HeaderMap,
    body: Bytes,
) -> (StatusCode, &'static str) {
    let user = headers
        .get("x-user-id")
        .map_or(&b""[..], http::HeaderValue::as_bytes);
    let mut h = blake3::Hasher::new();
    h.update(user);
    h.update(b"\0");
    h.update(&body);
    let digest = h.finalize();
    let managers = match cx {
        HandRolled::Redis(managers) => managers,
        HandRolled::Memory(keys) => {
            let mut key = [0u8; 16];
            key.copy_from_slice(&digest.as_bytes()[..16]);
            let now = Instant::now();
            let fresh = {
                let mut keys = keys.lock().unwrap_or_else(PoisonError::into_inner);
                match keys.get(&key) {
                    Some(until) if *until > now => false,
                    _ => {
                        keys.insert(key, now + HELD);
                        true
                    }
                }
            };
            return if fresh {
                created(body).await
            } else {
                (StatusCode::CONFLICT, r#"{"error":"duplicate"}"#)
            };
        }
    };
    let hex = digest.to_hex();
    let key = format!("dup:{}", &hex[..32]);
    let slot = usize::from(digest.as_bytes()[0]) % managers.len();
    let mut con = managers[slot].clone();
    let taken: redis::RedisResult<Option<String>> =
        super::set_nx_px(&key).query_async(&mut con).await;
    match taken {
        // The work never fails here, so the article's release on error (an
        // unconditional `DEL`, which could free a key another request took
        // after this one's expired) never runs, and is left out.
        Ok(Some(_)) => created(body).await,
        Ok(None) => (StatusCode::CONFLICT, r#"{"error":"duplicate"}"#),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, r#"{"error":"redis"}"#),
    }
}

pub(crate) async fn http(
    store: &AnyStore,
    load: &Load,
    run: u64,
    guard: Guard,
    url: Option<&str>,
) -> Result<Sample, BenchError> {
    let row = match guard {
        Guard::Unguarded => "http.unguarded",
        Guard::Layer => "http.guarded",
        Guard::HandRolled => "http.handrolled",
    };
    let app = match guard {
        Guard::Layer => {
            let guard = FingerprintGuard::new(store.clone());
            Router::new().route(
                "/orders",
                post(created).layer(FingerprintLayer::new(guard).route("/orders")),
            )
        }
        Guard::Unguarded => Router::new().route("/orders", post(created)),
        Guard::HandRolled => {
            let cx = match url {
                Some(url) => {
                    let client = redis::Client::open(url)?;
                    let mut managers = Vec::new();
                    for _ in 0..norepeat::store::DEFAULT_CONNECTIONS.max(1) {
                        managers.push(ConnectionManager::new(client.clone()).await?);
                    }
                    HandRolled::Redis(managers.into())
                }
                None => HandRolled::Memory(Arc::default()),
            };
            Router::new()
                .route("/orders", post(handrolled))
                .with_state(cx)
        }
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let client = reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(load.concurrency)
        .build()?;
    let url: Arc<str> = Arc::from(format!("http://{addr}/orders"));
    let tag = match guard {
        Guard::Unguarded => 'u',
        Guard::Layer => 'g',
        Guard::HandRolled => 'h',
    };
    let result = measure(load, move |id| {
        let client = client.clone();
        let url = Arc::clone(&url);
        let body = format!(r#"{{"sku":"SKU-1","quantity":1,"note":"{run:016x}{tag}{id}"}}"#);
        async move {
            let res = client
                .post(&*url)
                .header("x-user-id", "bench-user")
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await?;
            let status = res.status();
            let bytes = res.bytes().await?;
            if status != reqwest::StatusCode::CREATED {
                return Err(BenchError::unexpected(
                    row,
                    format!("answered {status}: {}", String::from_utf8_lossy(&bytes)),
                ));
            }
            Ok(())
        }
    })
    .await;
    server.abort();
    result
}
