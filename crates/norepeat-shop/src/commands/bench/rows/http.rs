//! `http.unguarded` and `http.guarded`: `POST /orders` over loopback to a
//! trivial axum route (reads the body, answers 201), without and with the
//! fingerprint guard, driven by one keep-alive reqwest client from every
//! task, each request a new body (so each guarded one is a new
//! fingerprint).

use super::super::BenchError;
use super::super::harness::{Load, Sample, measure};
use axum::Router;
use axum::routing::post;
use bytes::Bytes;
use http::StatusCode;
use norepeat::fingerprint::{FingerprintGuard, FingerprintLayer};
use norepeat::store::AnyStore;
use std::sync::Arc;

async fn created(_body: Bytes) -> (StatusCode, &'static str) {
    (StatusCode::CREATED, r#"{"created":true}"#)
}

pub(crate) async fn http(
    store: &AnyStore,
    load: &Load,
    run: u64,
    guarded: bool,
) -> Result<Sample, BenchError> {
    let row = if guarded {
        "http.guarded"
    } else {
        "http.unguarded"
    };
    let app = if guarded {
        let guard = FingerprintGuard::new(store.clone());
        Router::new().route(
            "/orders",
            post(created).layer(FingerprintLayer::new(guard).route("/orders")),
        )
    } else {
        Router::new().route("/orders", post(created))
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
    let tag = if guarded { 'g' } else { 'u' };
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
