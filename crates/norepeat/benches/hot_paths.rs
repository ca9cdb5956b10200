//! The CPU parts of a decision, with criterion:
//!
//! - `canonicalise/*`: a request fingerprint of a small order (the shop
//!   bench's HTTP body), a 1 KiB and a 64 KiB JSON body, next to a plain `serde_json::from_slice::<Value>` of the same
//!   bytes (the floor: canonicalising parses, then hashes);
//! - `keys/*`: building a store key;
//! - `memory_store/*`: `put_if_absent` on the in-process store, a new key and
//!   a held one;
//! - `layer/*`: one request through `FingerprintLayer` on the
//!   memory store over a trivial service, against the bare service.
//!
//! `cargo bench -p norepeat --bench hot_paths`

#![allow(missing_docs, clippy::unwrap_used)]

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use http::{Request, Response};
use http_body_util::Full;
use norepeat::fingerprint::{FingerprintGuard, FingerprintLayer};
use norepeat::fingerprint::{Fingerprinter, RequestParts};
use norepeat::keys::{KeyBuilder, Namespace};
use norepeat::store::{Fallback, KeyValueStoreExt, MemoryStore};
use serde_json::{Value, json};
use std::convert::Infallible;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tower::{Layer, ServiceExt};

/// An order-like JSON body of about `size` bytes: nested objects, arrays,
/// strings, integers and decimals, keys out of order, an ignored field.
fn body_of(size: usize) -> Vec<u8> {
    let mut items = Vec::new();
    let mut i = 0u64;
    loop {
        let doc = json!({
            "traceId": "3f1c0b7e-8d52-4a57-9d1e-5a2b7f0c9e11",
            "orderId": "ord-20240611-000123",
            "customer": {"id": "u-1842", "tier": "gold", "email": "someone@example.com"},
            "items": items,
            "currency": "EUR",
            "total": 1999.95,
        });
        let bytes = serde_json::to_vec(&doc).unwrap();
        if bytes.len() >= size {
            return bytes;
        }
        items.push(json!({
            "sku": format!("SKU-{i:05}"),
            "quantity": i % 7 + 1,
            "unitPrice": 12.5 + i as f64,
            "options": {"gift": i.is_multiple_of(2), "note": "leave at the door"},
            "tags": ["a", "b"],
        }));
        i += 1;
    }
}

fn canonicalise(c: &mut Criterion) {
    let fp = Fingerprinter::default();
    let mut g = c.benchmark_group("canonicalise");
    // `small` is the body of the shop bench's HTTP rows (an order).
    let small = br#"{"sku":"SKU-1","quantity":1,"note":"00000000d2f1c3a7g123456"}"#.to_vec();
    for (label, body) in [
        ("small", small),
        ("1KiB", body_of(1024)),
        ("64KiB", body_of(64 * 1024)),
    ] {
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_with_input(
            BenchmarkId::new("serde_json_parse", label),
            &body,
            |b, body| {
                b.iter(|| black_box(serde_json::from_slice::<Value>(black_box(body)).unwrap()));
            },
        );
        g.bench_with_input(
            BenchmarkId::new("fingerprint_json", label),
            &body,
            |b, body| {
                b.iter(|| {
                    black_box(
                        fp.fingerprint(&RequestParts {
                            user: "u-1842",
                            method: "POST",
                            route: "/orders",
                            query: None,
                            json: true,
                            body: black_box(body),
                        })
                        .unwrap(),
                    )
                });
            },
        );
        g.bench_with_input(
            BenchmarkId::new("fingerprint_bytes", label),
            &body,
            |b, body| {
                b.iter(|| {
                    black_box(
                        fp.fingerprint(&RequestParts {
                            user: "u-1842",
                            method: "POST",
                            route: "/orders",
                            query: None,
                            json: false,
                            body: black_box(body),
                        })
                        .unwrap(),
                    )
                });
            },
        );
    }
    g.finish();
}

fn keys(c: &mut Criterion) {
    let k = KeyBuilder::default();
    let digest = [7u8; 32];
    let mut g = c.benchmark_group("keys");
    g.bench_function("key_for_digest", |b| {
        b.iter(|| black_box(k.key_for_digest(Namespace::Fingerprint, black_box(&digest))));
    });
    g.bench_function("key_from_parts", |b| {
        b.iter(|| {
            black_box(k.key(
                Namespace::Idempotency,
                black_box(&[
                    b"u-1842".as_slice(),
                    b"POST",
                    b"/payments",
                    b"8e03978e-40d5-43e8-bc93-6894a57f9324",
                ]),
            ))
        });
    });
    g.finish();
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn memory_store(c: &mut Criterion) {
    let rt = rt();
    let store = MemoryStore::default();
    let ttl = Duration::from_secs(3);
    let n = AtomicU64::new(0);
    let mut g = c.benchmark_group("memory_store");
    g.bench_function("put_if_absent_new", |b| {
        b.to_async(&rt).iter(|| {
            let key = format!("nr:f:{{{:022}}}", n.fetch_add(1, Ordering::Relaxed));
            let store = &store;
            async move { black_box(store.put_if_absent(&key, b"1718000000000123456", ttl).await) }
        });
    });
    rt.block_on(store.put_if_absent("nr:f:{held}", b"1", Duration::from_secs(600)))
        .unwrap();
    g.bench_function("put_if_absent_held", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(store.put_if_absent("nr:f:{held}", b"2", ttl).await) });
    });
    g.finish();
}

/// What the local fallback costs a healthy store's new key: the same
/// memory store as primary, bare, behind a disabled `Fallback`, and behind
/// one that remembers the keys the primary took.
fn fallback(c: &mut Criterion) {
    let rt = rt();
    let ttl = Duration::from_secs(3);
    let n = AtomicU64::new(0);
    let mut g = c.benchmark_group("fallback");
    let disabled = Fallback::disabled(MemoryStore::default());
    let enabled = Fallback::new(MemoryStore::default(), MemoryStore::default());
    g.bench_function("put_if_absent_new_disabled", |b| {
        b.to_async(&rt).iter(|| {
            let key = format!("nr:f:{{{:022}}}", n.fetch_add(1, Ordering::Relaxed));
            let store = &disabled;
            async move { black_box(store.put_if_absent(&key, b"1718000000000123456", ttl).await) }
        });
    });
    g.bench_function("put_if_absent_new_remembered", |b| {
        b.to_async(&rt).iter(|| {
            let key = format!("nr:f:{{{:022}}}", n.fetch_add(1, Ordering::Relaxed));
            let store = &enabled;
            async move { black_box(store.put_if_absent(&key, b"1718000000000123456", ttl).await) }
        });
    });
    g.finish();
}

fn layer(c: &mut Criterion) {
    let rt = rt();
    let inner = tower::service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"created"))))
    });
    let guarded = FingerprintLayer::new(FingerprintGuard::new(MemoryStore::default()))
        .route("/orders")
        .layer(inner);
    let n = AtomicU64::new(0);
    let request = || {
        let body = format!(
            r#"{{"sku":"SKU-1","quantity":1,"note":"{}"}}"#,
            n.fetch_add(1, Ordering::Relaxed)
        );
        Request::post("/orders")
            .header("x-user-id", "u-1842")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    };
    let mut g = c.benchmark_group("layer");
    g.bench_function("bare_service", |b| {
        b.to_async(&rt).iter(|| {
            let req = request();
            let svc = inner;
            async move { black_box(svc.oneshot(req).await.unwrap()) }
        });
    });
    g.bench_function("fingerprint_layer_memory", |b| {
        b.to_async(&rt).iter(|| {
            let req = request();
            let svc = guarded.clone();
            async move {
                let res = svc.oneshot(req).await.unwrap();
                assert_eq!(res.status(), 200);
                black_box(res)
            }
        });
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = canonicalise, keys, memory_store, fallback, layer
}
criterion_main!(benches);
