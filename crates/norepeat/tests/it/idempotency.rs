// Over 400 lines on purpose: every answer of the layer on every store, sharing one handler and its helpers.
//! `Idempotency-Key` with replay, against the memory store and a real Redis.
//!
//! Every case that takes a store runs twice (module `memory` and `redis`);
//! the Redis run also checks that no key was left without a time to live.
//!
//! Over 400 lines: every case runs per store through one macro and shares
//! the steered payment handler at the top.
#![allow(clippy::unwrap_used)]

use crate::common::each_store;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, StatusCode};
#[cfg(feature = "redis")]
use norepeat::degrade::FailurePolicy;
use norepeat::idempotency::{
    Abandoned, IdempotencyLayer, OutcomeUnknown, Reconciled, RecordState, StorePolicy,
};
use norepeat::keys::{KeyBuilder, Namespace};
#[cfg(feature = "redis")]
use norepeat::store::Resilient;
use norepeat::store::{KeyValueStore, KeyValueStoreExt, MemoryStore, Store};
use norepeat_testkit::{Answer, send, send_until_break};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tower::ServiceExt;
#[cfg(feature = "redis")]
use {
    norepeat::store::RedisStore,
    norepeat_testkit::{ProxyMode, RedisServer, TcpProxy},
};

type Runs = Arc<AtomicUsize>;

/// The holds that handler runs sent with `x-hold: N` wait on.
static HOLDS: std::sync::LazyLock<std::sync::Mutex<HashMap<u64, Arc<Semaphore>>>> =
    std::sync::LazyLock::new(Default::default);

/// Keeps the handler runs sent with [`Hold::header`] from answering until
/// [`Hold::release`]: "the first one still runs" is then a fact, not a race
/// with a timer on a busy machine. One per use, so tests running side by
/// side in one process never let each other's runs go.
struct Hold(u64, Arc<Semaphore>);

impl Hold {
    fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let gate = Arc::new(Semaphore::new(0));
        HOLDS.lock().unwrap().insert(id, Arc::clone(&gate));
        Self(id, gate)
    }

    fn header(&self) -> (&'static str, String) {
        ("x-hold", self.0.to_string())
    }

    /// Lets every held run (and any later one) answer.
    fn release(&self) {
        self.1.close();
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.release();
        if let Ok(mut holds) = HOLDS.lock() {
            holds.remove(&self.0);
        }
    }
}

/// A payment handler that counts its runs. Request headers steer it:
/// `x-sleep-ms`, `x-hold` (waits for its [`Hold`]), `x-status`, `x-big` (a body of that many bytes, exact
/// size), `x-stream` (that many 1000-byte chunks, unknown size), `x-sse`,
/// `x-break` (that many chunks, then an error), `x-trailers` (a body with
/// trailers), `x-unknown` (the answer marked [`OutcomeUnknown`]).
async fn pay(State(runs): State<Runs>, headers: HeaderMap, _body: Bytes) -> Response {
    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
    let num = |name: &str| -> Option<u64> { headers.get(name)?.to_str().ok()?.parse().ok() };
    if let Some(ms) = num("x-sleep-ms") {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if let Some(id) = num("x-hold") {
        let gate = HOLDS.lock().unwrap().get(&id).cloned();
        if let Some(gate) = gate {
            // Closed on release: the error is the go-ahead.
            let _ = gate.acquire().await;
        }
    }
    let status = num("x-status")
        .and_then(|s| StatusCode::from_u16(u16::try_from(s).ok()?).ok())
        .unwrap_or(StatusCode::CREATED);
    let common = [
        ("set-cookie", "session=secret".to_owned()),
        ("location", format!("/payments/p{n}")),
        ("x-run", n.to_string()),
    ];
    if let Some(size) = num("x-big") {
        let body = vec![b'x'; usize::try_from(size).unwrap()];
        return (status, common, body).into_response();
    }
    if let Some(chunks) = num("x-stream") {
        let stream = futures_util::stream::iter(
            (0..chunks)
                .map(|i| Ok::<_, std::io::Error>(Bytes::from(vec![b'a' + (i % 26) as u8; 1000]))),
        );
        return (status, common, Body::from_stream(stream)).into_response();
    }
    if let Some(chunks) = num("x-break") {
        // That many chunks, then the stream fails.
        let stream = futures_util::stream::iter((0..=chunks).map(move |i| {
            if i < chunks {
                Ok(Bytes::from_static(b"chunk"))
            } else {
                Err(std::io::Error::other("the stream broke"))
            }
        }));
        return (status, common, Body::from_stream(stream)).into_response();
    }
    if headers.contains_key("x-trailers") {
        let frames = [
            Ok::<_, std::io::Error>(http_body::Frame::data(Bytes::from_static(b"paid"))),
            Ok(http_body::Frame::trailers(HeaderMap::from_iter([(
                http::HeaderName::from_static("x-checksum"),
                HeaderValue::from_static("1"),
            )]))),
        ];
        let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
        return (status, common, Body::new(body)).into_response();
    }
    if headers.contains_key("x-unknown") {
        return (status, axum::Extension(OutcomeUnknown), "timed out").into_response();
    }
    if headers.contains_key("x-sse") {
        return (
            status,
            [("content-type", "text/event-stream")],
            "data: hi\n\n",
        )
            .into_response();
    }
    let body = format!(r#"{{"paymentId":"p{n}","orderId":"o1","amount":1999,"status":"PENDING"}}"#);
    (status, common, [("content-type", "application/json")], body).into_response()
}

fn app<G: KeyValueStore + Clone>(layer: IdempotencyLayer<G>, runs: &Runs) -> Router {
    Router::new()
        .route("/payments", post(pay).layer(layer.route("/payments")))
        .with_state(Arc::clone(runs))
}

fn payment(user: &str, key: Option<&[u8]>) -> http::request::Builder {
    let mut b = Request::post("/payments")
        .header("x-user-id", user)
        .header("content-type", "application/json");
    if let Some(k) = key {
        b = b.header("idempotency-key", HeaderValue::from_bytes(k).unwrap());
    }
    b
}

const BODY: &str = r#"{"orderId":"o1","amount":1999}"#;

/// The store key of `user`'s `POST /payments` with `Idempotency-Key: key`
/// (the layer's default key layout).
fn record_key(user: &str, key: &str) -> String {
    KeyBuilder::default().key(
        Namespace::Idempotency,
        &[user.as_bytes(), b"POST", b"/payments", key.as_bytes()],
    )
}

async fn pay_with(app: &Router, user: &str, key: &str, body: &str) -> Answer {
    send(
        app,
        payment(user, Some(key.as_bytes()))
            .body(Body::from(body.to_owned()))
            .unwrap(),
    )
    .await
}

async fn pay_steered(app: &Router, key: &str, header: (&str, &str)) -> Answer {
    send(
        app,
        payment("u1", Some(key.as_bytes()))
            .header(header.0, header.1)
            .body(Body::from(BODY))
            .unwrap(),
    )
    .await
}

/// Stamps `each_store!`'s two runs of each case and, with the features, a
/// PostgreSQL and a SQLite run (the layer runs on any key-value store).
macro_rules! every_store {
    ($($case:ident),* $(,)?) => {$(
        each_store!(@case #[tokio::test(flavor = "multi_thread", worker_threads = 2)] $case [] {
            #[cfg(feature = "postgres")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                let db = norepeat_testkit::PgDatabase::fresh().await;
                let pool = sqlx::PgPool::connect(&db.url()).await.unwrap();
                let store = norepeat::store::PgStore::new(pool);
                store.migrate().await.unwrap();
                super::$case(store).await;
            }

            #[cfg(feature = "sqlite")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                // One connection: each connection to `:memory:` is a database of its own.
                let pool = sqlx::sqlite::SqlitePoolOptions::new()
                    .max_connections(1)
                    .connect("sqlite::memory:")
                    .await
                    .unwrap();
                let store = norepeat::store::SqliteStore::new(pool);
                store.migrate().await.unwrap();
                super::$case(store).await;
            }
        });
    )*};
}

every_store!(
    oversized_response_passes_through_and_its_outcome_is_kept,
    streaming_response_passes_through_whole_and_its_outcome_is_kept,
    a_success_whose_body_breaks_is_not_run_again,
    a_claim_past_its_lease_is_an_unknown_outcome_until_its_owner_answers,
    a_key_compares_the_whole_body,
    an_unknown_outcome_is_kept_refused_and_cleared_by_an_operator,
    an_unknown_outcome_is_reconciled_by_the_applications_lookup,
    a_key_from_the_form_replays_the_303_to_the_second_click,
);

each_store!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    repeat_is_replayed_byte_for_byte_without_a_run,
    other_request_same_key_is_422,
    running_key_is_409_with_retry_after,
    missing_and_invalid_keys_are_400,
    keys_are_per_user,
    hundred_concurrent_run_once_others_409,
    hundred_concurrent_with_waiting_all_get_the_replay,
    stale_completion_is_fenced_out,
    renewal_keeps_a_slow_handlers_claim,
    small_stream_is_stored,
    server_errors_release_the_key,
    store_all_replays_server_errors,
    request_describing_4xx_are_stored_moment_ones_not,
    request_body_over_64k_is_413,
    waiting_repeat_runs_itself_when_the_first_fails,
    a_claim_the_previous_release_wrote_is_honoured,
    a_record_this_release_cannot_read_is_refused_not_run,
    past_max_detached_is_503_before_the_claim,
    a_panicking_handler_releases_the_key,
);

/// A handler that panics releases its key at once (a panic is a failure,
/// as a 5xx is): the claim is gone, and the same request with the same
/// `Idempotency-Key` runs the handler a second time, neither 409 nor a
/// replay. The lease is a minute and the release is polled for at most
/// 5 s, so the lease's own end cannot stand in for the release.
async fn a_panicking_handler_releases_the_key<G: Store + Clone>(store: G) {
    let runs = Runs::default();
    let panic_next = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let layer = IdempotencyLayer::new(store.clone())
        .route("/payments")
        .lease(Duration::from_secs(60));
    let app = crate::common::panicking_route("/payments", layer, Arc::clone(&runs), panic_next);
    let req = || payment("u1", Some(b"k")).body(Body::from(BODY)).unwrap();
    crate::common::send_and_panic(&app, req()).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The release runs in a short task: poll the store until the claim is
    // gone (a probe that finds the key free takes it, then gives it back).
    let key = record_key("u1", "k");
    crate::common::eventually_within(Duration::from_secs(5), "the panic's release", || async {
        let free = store
            .put_if_absent(&key, b"probe", Duration::from_secs(60))
            .await
            .unwrap()
            .is_none();
        free.then_some(())
    })
    .await;
    assert!(store.delete_if_equals(&key, b"probe").await.unwrap());
    let retry = send(&app, req()).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{:?}", retry.body);
    assert!(!retry.replayed(), "the panic's outcome was stored");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "the retry ran the handler");
    // The retry's success is kept: the next one is its replay.
    assert!(send(&app, req()).await.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Past `max_detached` handlers running at once (here one, whose client
/// left), a request is answered 503 `guard_unavailable` with
/// `Retry-After` before its key is claimed: the key stays free, and once a
/// slot is free the retry runs.
async fn past_max_detached_is_503_before_the_claim<G: KeyValueStore + Clone>(store: G) {
    let runs = Runs::default();
    let layer = IdempotencyLayer::new(store.clone()).max_detached(1);
    let detached = layer.detached_tasks();
    let app = app(layer, &runs);
    let hold = Hold::new();
    let gone = {
        let app = app.clone();
        let h = hold.header();
        tokio::spawn(async move { pay_steered(&app, "k1", (h.0, &h.1)).await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while runs.load(Ordering::SeqCst) == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    gone.abort();
    assert_eq!(detached.len(), 1, "the handler runs on without its client");

    let refused = pay_with(&app, "u1", "k2", BODY).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.code(), "guard_unavailable");
    assert_eq!(refused.headers["retry-after"], "1");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The key was not claimed.
    let key = record_key("u1", "k2");
    let probe = store
        .put_if_absent(&key, b"probe", Duration::from_secs(60))
        .await;
    assert_eq!(probe.unwrap(), None, "k2 was claimed");
    assert!(store.delete_if_equals(&key, b"probe").await.unwrap());

    hold.release();
    detached.close();
    tokio::time::timeout(Duration::from_secs(20), detached.wait())
        .await
        .expect("the detached handler ends");
    let retry = pay_with(&app, "u1", "k2", BODY).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert!(pay_with(&app, "u1", "k1", BODY).await.replayed());
}

async fn repeat_is_replayed_byte_for_byte_without_a_run<G: Store + Clone>(store: G) {
    let runs = Runs::default();
    let app = app(IdempotencyLayer::new(store), &runs);
    let first = pay_with(&app, "u1", "k-1", BODY).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    assert!(first.headers.contains_key("set-cookie"));
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // Same request, fields in another order: the same request.
    for body in [BODY, r#"{"amount":1999,"orderId":"o1"}"#] {
        let again = pay_with(&app, "u1", "k-1", body).await;
        assert_eq!(again.status, StatusCode::CREATED);
        assert!(again.replayed());
        assert_eq!(again.body, first.body, "byte for byte");
        assert_eq!(again.headers["content-type"], "application/json");
        assert_eq!(again.headers["location"], first.headers["location"]);
        assert!(!again.headers.contains_key("set-cookie"), "never replayed");
        assert!(
            !again.headers.contains_key("x-run"),
            "not on the allow-list"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "a replay costs no run");

    // The draft's quoted form is the same key.
    let quoted = pay_with(&app, "u1", "\"k-1\"", BODY).await;
    assert!(quoted.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

async fn other_request_same_key_is_422<G: Store + Clone>(store: G) {
    let runs = Runs::default();
    let app = app(IdempotencyLayer::new(store), &runs);
    assert_eq!(pay_with(&app, "u1", "k", BODY).await.status, 201);
    let other = pay_with(&app, "u1", "k", r#"{"orderId":"o1","amount":2000}"#).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other.code(), "idempotency_key_mismatch");
    assert_eq!(other.headers["content-type"], "application/problem+json");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The same bytes as another media type are another request to a
    // backend (a form, not JSON): a mismatch, not a replay (issue 52); a
    // charset or the case of the type is the same one.
    for (media, status) in [
        ("text/plain", StatusCode::UNPROCESSABLE_ENTITY),
        (
            "application/x-www-form-urlencoded",
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        ("Application/JSON; charset=utf-8", StatusCode::CREATED),
    ] {
        let mut req = payment("u1", Some(b"k")).body(Body::from(BODY)).unwrap();
        req.headers_mut()
            .insert(http::header::CONTENT_TYPE, HeaderValue::from_static(media));
        let again = send(&app, req).await;
        assert_eq!(again.status, status, "{media}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A rolling deploy: an instance of the release before the 12-byte
/// in-progress record (version 3) holds a key with its 28-byte version-2
/// claim. This release must read it: a retry waits (409), a different
/// request is refused (422), nothing runs twice; and once the old instance
/// completes, the result is replayed.
async fn a_claim_the_previous_release_wrote_is_honoured<G: Store + Clone>(store: G) {
    let runs = Runs::default();
    let app = app(IdempotencyLayer::new(store.clone()), &runs);
    let first = pay_with(&app, "u1", "k", BODY).await;
    assert_eq!(first.status, StatusCode::CREATED);
    // The completed record (version 2) carries the whole 16-byte request
    // fingerprint after its version and state bytes: the old claim is made
    // from it.
    let key = record_key("u1", "k");
    let ttl = Duration::from_secs(60);
    let completed = store.put_if_absent(&key, b"x", ttl).await.unwrap().unwrap();
    assert_eq!(&completed[..2], &[2, 2], "a version-2 completed record");
    // Version 2 (28 bytes) and version 3 (12 bytes, the release before
    // this one): in progress, with no lease deadline.
    let mut v2 = vec![2u8, 1];
    v2.extend_from_slice(&completed[2..18]);
    v2.extend_from_slice(&[0xa5; 10]);
    let mut v3 = vec![3u8, 1];
    v3.extend_from_slice(&completed[2..6]);
    v3.extend_from_slice(&[0xa5; 6]);
    for old_claim in [v2, v3] {
        assert!(
            store
                .replace_if_equals(&key, &completed, &old_claim, ttl)
                .await
                .unwrap()
        );
        let retry = pay_with(&app, "u1", "k", BODY).await;
        assert_eq!(retry.status, StatusCode::CONFLICT);
        assert_eq!(retry.code(), "idempotency_key_in_use");
        let other = pay_with(&app, "u1", "k", r#"{"orderId":"o1","amount":2000}"#).await;
        assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(other.code(), "idempotency_key_mismatch");
        // The old instance completes (owner-checked on its own bytes).
        assert!(
            store
                .replace_if_equals(&key, &old_claim, &completed, ttl)
                .await
                .unwrap()
        );
    }
    let replay = pay_with(&app, "u1", "k", BODY).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A record of a version this release does not know (what a release
/// before version 3 meets when a newer instance holds a key): the request
/// is refused by the store-failure policy (closed by default: 503), never
/// run as if the key were free.
async fn a_record_this_release_cannot_read_is_refused_not_run<G: Store + Clone>(store: G) {
    let runs = Runs::default();
    let app = app(IdempotencyLayer::new(store.clone()), &runs);
    let future_record = [9u8, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let held = store
        .put_if_absent(
            &record_key("u1", "k"),
            &future_record,
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert!(held.is_none());
    let refused = pay_with(&app, "u1", "k", BODY).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.code(), "guard_unavailable");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

async fn running_key_is_409_with_retry_after<G: Store + Clone>(store: G) {
    let runs = Runs::default();
    let app = app(IdempotencyLayer::new(store), &runs);
    let hold = Hold::new();
    let slow = {
        let app = app.clone();
        let h = hold.header();
        tokio::spawn(async move { pay_steered(&app, "k", (h.0, &h.1)).await })
    };
    running(&runs).await;
    let busy = pay_with(&app, "u1", "k", BODY).await;
    assert_eq!(busy.status, StatusCode::CONFLICT);
    assert_eq!(busy.code(), "idempotency_key_in_use");
    assert_eq!(busy.headers["retry-after"], "1");
    // A different request under the running key is a mismatch, not a wait.
    let other = pay_with(&app, "u1", "k", r#"{"orderId":"o2","amount":1}"#).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    hold.release();
    assert_eq!(slow.await.unwrap().status, StatusCode::CREATED);
    assert!(pay_with(&app, "u1", "k", BODY).await.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

async fn missing_and_invalid_keys_are_400<G: Store + Clone>(store: G) {
    let runs = Runs::default();
    let app = app(IdempotencyLayer::new(store.clone()), &runs);
    let missing = send(&app, payment("u1", None).body(Body::from(BODY)).unwrap()).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(missing.code(), "missing_idempotency_key");

    let long = vec![b'k'; 256];
    for bad in [&b""[..], &long, b"caf\xc3\xa9", b"a b", b"\"\""] {
        let res = send(
            &app,
            payment("u1", Some(bad)).body(Body::from(BODY)).unwrap(),
        )
        .await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{bad:?}");
        assert_eq!(res.code(), "invalid_idempotency_key");
    }
    let ok255 = String::from_utf8(vec![b'k'; 255]).unwrap();
    assert_eq!(pay_with(&app, "u1", &ok255, BODY).await.status, 201);

    let no_user = send(
        &app,
        Request::post("/payments")
            .header("idempotency-key", "k")
            .body(Body::from(BODY))
            .unwrap(),
    )
    .await;
    assert_eq!(no_user.status, StatusCode::UNAUTHORIZED);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // Optional keys: no key, no guard; every request runs.
    let optional = self::app(IdempotencyLayer::new(store).required(false), &runs);
    for _ in 0..2 {
        let res = send(
            &optional,
            payment("u1", None).body(Body::from(BODY)).unwrap(),
        )
        .await;
        assert_eq!(res.status, StatusCode::CREATED);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

async fn keys_are_per_user<G: Store + Clone>(store: G) {
    let runs = Runs::default();
    let app = app(IdempotencyLayer::new(store), &runs);
    let a = pay_with(&app, "u1", "same", BODY).await;
    let b = pay_with(&app, "u2", "same", BODY).await;
    assert_eq!(
        (a.status, b.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(!b.replayed());
    assert_ne!(a.body, b.body);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// `n` copies of one request at once. The one that runs is held until
/// `n - answered_first` of them have answered (all the others, when they
/// do not wait; none when they do), so none comes after it has ended.
async fn concurrent(app: &Router, n: usize, answered_first: usize) -> Vec<Answer> {
    let hold = Hold::new();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let app = app.clone();
            let h = hold.header();
            tokio::spawn(async move { pay_steered(&app, "hot", (h.0, &h.1)).await })
        })
        .collect();
    crate::common::eventually("the others have answered", || async {
        (tasks.iter().filter(|t| t.is_finished()).count() >= answered_first).then_some(())
    })
    .await;
    hold.release();
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

async fn hundred_concurrent_run_once_others_409<G: Store + Clone>(store: G) {
    let runs = Runs::default();
    let app = app(IdempotencyLayer::new(store), &runs);
    let answers = concurrent(&app, 100, 99).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let created = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED)
        .count();
    let busy = answers
        .iter()
        .filter(|a| a.status == StatusCode::CONFLICT && a.code() == "idempotency_key_in_use")
        .count();
    assert_eq!((created, busy), (1, 99));
}

async fn hundred_concurrent_with_waiting_all_get_the_replay<G: Store + Clone>(store: G) {
    let runs = Runs::default();
    let layer = IdempotencyLayer::new(store).wait_for_result(Duration::from_secs(10));
    let app = app(layer, &runs);
    // They wait: the one that runs is let go at once (a copy that comes
    // after it has ended gets the replay all the same).
    let answers = concurrent(&app, 100, 0).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(answers.iter().all(|a| a.status == StatusCode::CREATED));
    assert!(answers.iter().all(|a| a.body == answers[0].body));
    assert_eq!(answers.iter().filter(|a| a.replayed()).count(), 99);
}

async fn stale_completion_is_fenced_out<G: Store + Clone>(store: G) {
    let runs = Runs::default();
    let layer = IdempotencyLayer::new(store)
        .lease(Duration::from_millis(50))
        .lease_renewal(false)
        .abandoned(Abandoned::Retry);
    let app = app(layer, &runs);
    let (stale, hold) = held_first(&app, &runs).await;
    // Its 50 ms lease and the second allowed for clocks that disagree: its
    // claim is abandoned, this one takes it over and completes.
    tokio::time::sleep(Duration::from_millis(1_250)).await;
    a_retry_takes_over_from(&app, &runs, stale, &hold).await;
}

/// By default a claim whose lease passed unrenewed is an unknown outcome:
/// a repeat is refused 409 `idempotency_outcome_unknown` and does not run.
/// Its owner was only slow, not dead: its answer, when it comes, completes
/// the record (nobody took the claim over), and later repeats replay it.
async fn a_claim_past_its_lease_is_an_unknown_outcome_until_its_owner_answers<
    G: KeyValueStore + Clone,
>(
    store: G,
) {
    let runs = Runs::default();
    let layer = IdempotencyLayer::new(store)
        .lease(Duration::from_millis(50))
        .lease_renewal(false);
    let app = app(layer, &runs);
    let (slow, hold) = held_first(&app, &runs).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    for _ in 0..3 {
        let repeat = pay_with(&app, "u1", "k", BODY).await;
        assert_eq!(repeat.status, StatusCode::CONFLICT, "{:?}", repeat.body);
        assert_eq!(repeat.json()["code"], "idempotency_outcome_unknown");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    hold.release();
    let first = slow.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    let replay = pay_with(&app, "u1", "k", BODY).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Sends a payment with key `k` that its handler holds until the returned
/// [`Hold`] is released, once that handler runs (its claim is taken).
async fn held_first(app: &Router, runs: &Runs) -> (JoinHandle<Answer>, Hold) {
    let hold = Hold::new();
    let first = {
        let app = app.clone();
        let h = hold.header();
        tokio::spawn(async move { pay_steered(&app, "k", (h.0, &h.1)).await })
    };
    running(runs).await;
    (first, hold)
}

/// Waits until the handler has started (so its request holds its claim),
/// polled rather than assumed after a fixed delay.
async fn running(runs: &Runs) {
    crate::common::eventually("the handler runs", || async {
        (runs.load(Ordering::SeqCst) >= 1).then_some(())
    })
    .await;
}

/// A retry of key `k` while `first` (paying `p1`, its claim lost) still
/// runs: the retry runs (`p2`) and completes; `first` still answers its own
/// client but cannot overwrite the retry's record, which later retries
/// replay. Two runs in all.
async fn a_retry_takes_over_from(
    app: &Router,
    runs: &Runs,
    first: JoinHandle<Answer>,
    hold: &Hold,
) {
    let second = pay_with(app, "u1", "k", BODY).await;
    assert_eq!(second.status, StatusCode::CREATED);
    assert!(!second.replayed());
    assert!(
        std::str::from_utf8(&second.body)
            .unwrap()
            .contains("\"p2\"")
    );
    // Only now does the first end (it was sent with `x-hold`).
    hold.release();
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(std::str::from_utf8(&first.body).unwrap().contains("\"p1\""));
    let replay = pay_with(app, "u1", "k", BODY).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, second.body, "the retry's record stands");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

async fn renewal_keeps_a_slow_handlers_claim<G: Store + Clone>(store: G) {
    let runs = Runs::default();
    let layer = IdempotencyLayer::new(store).lease(Duration::from_millis(300));
    let app = app(layer, &runs);
    let hold = Hold::new();
    let slow = {
        let app = app.clone();
        let h = hold.header();
        tokio::spawn(async move { pay_steered(&app, "k", (h.0, &h.1)).await })
    };
    // Past two leases since the handler started, still held: renewed. (The
    // handler waits for the test, so a slow machine cannot end it first.)
    running(&runs).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        pay_with(&app, "u1", "k", BODY).await.status,
        StatusCode::CONFLICT
    );
    hold.release();
    let first = slow.await.unwrap();
    let replay = pay_with(&app, "u1", "k", BODY).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The retry of a success whose body was not kept: the first status, an
/// empty body, `Idempotent-Replayed: true`, `Idempotent-Body: omitted`,
/// the replayable headers but those describing the body; no second run.
fn assert_replayed_without_body(retry: &Answer, first: &Answer) {
    assert_eq!(retry.status, first.status);
    assert!(retry.replayed());
    assert!(retry.body_omitted());
    assert!(retry.body.is_empty());
    assert_eq!(retry.headers.get("location"), first.headers.get("location"));
    assert!(!retry.headers.contains_key("content-type"));
}

async fn oversized_response_passes_through_and_its_outcome_is_kept<G: KeyValueStore + Clone>(
    store: G,
) {
    let runs = Runs::default();
    let app = app(IdempotencyLayer::new(store).max_body(1024), &runs);
    let big = pay_steered(&app, "k", ("x-big", "4096")).await;
    assert_eq!(big.status, StatusCode::CREATED);
    assert!(!big.replayed());
    assert!(!big.body_omitted());
    assert_eq!(big.body.len(), 4096, "passed through whole");
    let retry = pay_steered(&app, "k", ("x-big", "4096")).await;
    assert_replayed_without_body(&retry, &big);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the effect is not run again"
    );
    // Exactly at the cap is stored.
    let at_cap = pay_steered(&app, "k2", ("x-big", "1024")).await;
    let again = pay_steered(&app, "k2", ("x-big", "1024")).await;
    assert!(again.replayed());
    assert!(!again.body_omitted());
    assert_eq!(again.body, at_cap.body);
}

async fn streaming_response_passes_through_whole_and_its_outcome_is_kept<
    G: KeyValueStore + Clone,
>(
    store: G,
) {
    let runs = Runs::default();
    let app = app(IdempotencyLayer::new(store).max_body(2500), &runs);
    let res = pay_steered(&app, "k", ("x-stream", "5")).await;
    assert_eq!(res.status, StatusCode::CREATED);
    assert!(!res.replayed());
    let expected: Vec<u8> = (0..5u8).flat_map(|i| vec![b'a' + i; 1000]).collect();
    assert_eq!(&res.body[..], &expected[..], "every chunk, in order");
    assert_replayed_without_body(&pay_steered(&app, "k", ("x-stream", "5")).await, &res);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // An event stream is never held back to be stored; its outcome is kept.
    let sse = pay_steered(&app, "k-sse", ("x-sse", "1")).await;
    assert_eq!(&sse.body[..], b"data: hi\n\n");
    let again = pay_steered(&app, "k-sse", ("x-sse", "1")).await;
    assert_replayed_without_body(&again, &sse);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // Nor is a body with trailers (a replay could not give them back).
    let trailers = pay_steered(&app, "k-tr", ("x-trailers", "1")).await;
    assert_eq!(&trailers.body[..], b"paid");
    let again = pay_steered(&app, "k-tr", ("x-trailers", "1")).await;
    assert_replayed_without_body(&again, &trailers);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

/// A 2xx whose body fails half-way: the effect happened, so the key is
/// not freed; the retry gets the outcome without the body.
async fn a_success_whose_body_breaks_is_not_run_again<G: KeyValueStore + Clone>(store: G) {
    let runs = Runs::default();
    let app = app(IdempotencyLayer::new(store), &runs);
    let broken = send_until_break(
        &app,
        payment("u1", Some(b"k"))
            .header("x-break", "2")
            .body(Body::from(BODY))
            .unwrap(),
    )
    .await;
    assert_eq!(broken.status, StatusCode::CREATED);
    let retry = pay_steered(&app, "k", ("x-break", "2")).await;
    assert_replayed_without_body(&retry, &broken);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // A 5xx is not stored (the default policy): it frees the key, even
    // when its body breaks too.
    pay_steered(&app, "k5", ("x-status", "500")).await;
    let after_5xx = pay_with(&app, "u1", "k5", BODY).await;
    assert_eq!(after_5xx.status, StatusCode::CREATED);
    assert!(!after_5xx.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

async fn small_stream_is_stored<G: Store + Clone>(store: G) {
    let runs = Runs::default();
    let app = app(IdempotencyLayer::new(store).max_body(2500), &runs);
    let first = pay_steered(&app, "k", ("x-stream", "2")).await;
    let again = pay_steered(&app, "k", ("x-stream", "2")).await;
    assert!(again.replayed());
    assert_eq!(again.body.len(), 2000);
    assert_eq!(again.body, first.body);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

async fn server_errors_release_the_key<G: Store + Clone>(store: G) {
    let runs = Runs::default();
    let app = app(IdempotencyLayer::new(store), &runs);
    let failed = pay_steered(&app, "k", ("x-status", "500")).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    let retry = pay_with(&app, "u1", "k", BODY).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 2, "the retry ran");
    assert!(pay_with(&app, "u1", "k", BODY).await.replayed());
}

async fn store_all_replays_server_errors<G: Store + Clone>(store: G) {
    let runs = Runs::default();
    let app = app(
        IdempotencyLayer::new(store).store_policy(StorePolicy::All),
        &runs,
    );
    let failed = pay_steered(&app, "k", ("x-status", "500")).await;
    let again = pay_with(&app, "u1", "k", BODY).await;
    assert_eq!(again.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(again.replayed());
    assert_eq!(again.body, failed.body);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

async fn request_describing_4xx_are_stored_moment_ones_not<G: Store + Clone>(store: G) {
    let runs = Runs::default();
    let app = app(IdempotencyLayer::new(store.clone()), &runs);
    pay_steered(&app, "k400", ("x-status", "400")).await;
    let again = pay_with(&app, "u1", "k400", BODY).await;
    assert_eq!(
        (again.status, again.replayed()),
        (StatusCode::BAD_REQUEST, true)
    );
    // What describes the caller or a moment is not kept: the key is freed.
    let moment = ["401", "403", "404", "408", "409", "413", "429"];
    for (i, s) in moment.into_iter().enumerate() {
        let key = format!("k{s}");
        pay_steered(&app, &key, ("x-status", s)).await;
        let retry = pay_with(&app, "u1", &key, BODY).await;
        assert_eq!(retry.status, StatusCode::CREATED, "{s} not stored");
        assert_eq!(runs.load(Ordering::SeqCst), 1 + 2 * (i + 1));
    }
    // 2xx only: a 4xx is not kept either.
    let strict = self::app(
        IdempotencyLayer::new(store).store_policy(StorePolicy::SuccessOnly),
        &runs,
    );
    pay_steered(&strict, "s400", ("x-status", "400")).await;
    assert!(!pay_with(&strict, "u1", "s400", BODY).await.replayed());
}

async fn request_body_over_64k_is_413<G: Store + Clone>(store: G) {
    let runs = Runs::default();
    let app = app(IdempotencyLayer::new(store), &runs);
    let big = format!(r#"{{"pad":"{}"}}"#, "x".repeat(70 * 1024));
    let res = pay_with(&app, "u1", "k", &big).await;
    assert_eq!(res.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(res.code(), "payload_too_large");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

async fn waiting_repeat_runs_itself_when_the_first_fails<G: Store + Clone>(store: G) {
    let runs = Runs::default();
    let layer = IdempotencyLayer::new(store).wait_for_result(Duration::from_secs(5));
    let app = app(layer, &runs);
    let failing = {
        let app = app.clone();
        tokio::spawn(async move {
            send(
                &app,
                payment("u1", Some(b"k"))
                    .header("x-sleep-ms", "200")
                    .header("x-status", "503")
                    .body(Body::from(BODY))
                    .unwrap(),
            )
            .await
        })
    };
    running(&runs).await;
    let waiter = pay_with(&app, "u1", "k", BODY).await;
    assert_eq!(
        failing.await.unwrap().status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(waiter.status, StatusCode::CREATED);
    assert!(!waiter.replayed(), "it ran the handler itself");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn replay_survives_a_process_restart() {
    let redis = RedisServer::start().await;
    let first = {
        let runs = Runs::default();
        let store = RedisStore::connect(&redis.url()).await.unwrap();
        let app = app(IdempotencyLayer::new(store), &runs);
        pay_with(&app, "u1", "k", BODY).await
    };
    // A new "process": new connection, new layer, new handler.
    let runs = Runs::default();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let app = app(IdempotencyLayer::new(store), &runs);
    let again = pay_with(&app, "u1", "k", BODY).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // The record lives in Redis for the retention period, 24 h by default.
    let key = record_key("u1", "k");
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut redis.connection().await)
        .await
        .unwrap();
    assert!(pttl > 23 * 3600 * 1000, "pttl {pttl}");
    assert!(redis.keys_without_ttl().await.is_empty());
}

#[cfg(feature = "redis")]
/// The store forgets every record (FLUSHALL) while a request runs: the
/// first's lease renewal (owner-checked) finds its key gone and does not
/// write it back, a retry claims the key afresh and runs, and the first
/// request, when it ends, cannot overwrite the retry's record (the 12-byte
/// claim is still the fence). Its client still gets its own answer.
///
/// A 300 ms lease is renewed every 100 ms; the handler runs 2 s, so a
/// renewal is due soon after the flush. The test waits until Redis has run
/// a script (the renewal's `EVALSHA`; nothing else runs one then) after
/// the flush, and only then checks that no key came back and sends the
/// retry: a renewal that wrote the key back would fail both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_mid_run_the_retry_runs_and_the_first_cannot_overwrite_it() {
    let redis = RedisServer::start().await;
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let runs = Runs::default();
    let app = app(
        IdempotencyLayer::new(store).lease(Duration::from_millis(300)),
        &runs,
    );
    let hold = Hold::new();
    let first = {
        let app = app.clone();
        let h = hold.header();
        tokio::spawn(async move { pay_steered(&app, "k", (h.0, &h.1)).await })
    };
    crate::common::eventually("the first runs", || async {
        (runs.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    let mut admin = redis.connection().await;
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut admin)
        .await
        .unwrap();
    let flushed = scripts_run(&redis).await;
    crate::common::eventually("a renewal after the flush", || async {
        (scripts_run(&redis).await > flushed).then_some(())
    })
    .await;
    assert!(!first.is_finished(), "the renewal came before the end");
    assert_eq!(redis.dbsize().await, 0, "the renewal wrote the key back");
    a_retry_takes_over_from(&app, &runs, first, &hold).await;
    assert!(redis.keys_without_ttl().await.is_empty());
}

#[cfg(feature = "redis")]
/// How many scripts (`EVALSHA` and `EVAL` calls) `redis` has run, from its
/// `INFO commandstats` (FLUSHALL does not reset it).
async fn scripts_run(redis: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut redis.connection().await)
        .await
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

#[cfg(feature = "redis")]
/// Sends the request `req` builds, as a client that honours
/// `Retry-After` would, until it is answered neither 409 (the first one
/// still holds the key) nor 503 (the store is not back yet), for at most
/// 20 s.
async fn until_not_in_use(app: &Router, req: impl Fn() -> Request<Body>) -> Answer {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let res = send(app, req()).await;
        let wait = [StatusCode::CONFLICT, StatusCode::SERVICE_UNAVAILABLE].contains(&res.status);
        if !wait || tokio::time::Instant::now() > deadline {
            return res;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(feature = "redis")]
/// The store breaks while the handler runs, so storing its response fails,
/// and comes back a moment later: the key is not freed, the completion is
/// tried again until it lands, and the client's retry waits (409), then
/// gets the replay. The handler ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_that_fails_is_tried_again_and_the_retry_replays() {
    let redis = RedisServer::start().await;
    let proxy = TcpProxy::start(redis.addr()).await;
    let store = RedisStore::connect(&proxy.url_for_redis()).await.unwrap();
    let runs = Runs::default();
    let app = app(
        IdempotencyLayer::new(store).lease(Duration::from_secs(3)),
        &runs,
    );
    let hold = Hold::new();
    let first = {
        let app = app.clone();
        let h = hold.header();
        tokio::spawn(async move { pay_steered(&app, "k", (h.0, &h.1)).await })
    };
    // The handler runs (so the claim's answer has come back: the key on the
    // server alone is not enough), and answers only once the store is cut off.
    running(&runs).await;
    proxy.set_mode(ProxyMode::Refuse);
    hold.release();
    // The answer comes once the first try to store it has failed.
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    proxy.set_mode(ProxyMode::Pass);

    let retry = until_not_in_use(&app, || {
        payment("u1", Some(b"k")).body(Body::from(BODY)).unwrap()
    })
    .await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed(), "the retry ran the handler again");
    assert_eq!(retry.body, first.body);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(redis.keys_without_ttl().await.is_empty());
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn store_down_fails_closed_with_503() {
    let mut redis = RedisServer::start().await;
    let store = Resilient::new(RedisStore::connect(&redis.url()).await.unwrap())
        .timeout(Duration::from_millis(200));
    let runs = Runs::default();
    let closed = app(IdempotencyLayer::new(store.clone()), &runs);
    let open = app(
        IdempotencyLayer::new(store).on_store_failure(FailurePolicy::FailOpen),
        &runs,
    );
    redis.kill();
    let res = pay_with(&closed, "u1", "k", BODY).await;
    assert_eq!(res.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.code(), "guard_unavailable");
    assert!(res.headers.contains_key("retry-after"));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // Fail-open runs the handler, storing nothing.
    assert_eq!(
        pay_with(&open, "u1", "k", BODY).await.status,
        StatusCode::CREATED
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn handler_error_releases_the_key() {
    let store = MemoryStore::default();
    let calls = Runs::default();
    let svc = |fail: bool| {
        let calls = Arc::clone(&calls);
        tower::Layer::layer(
            &IdempotencyLayer::new(store.clone()),
            tower::service_fn(move |_req: Request<Body>| {
                calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    if fail {
                        Err(std::io::Error::other("handler failed"))
                    } else {
                        Ok(http::Response::new(http_body_util::Full::new(
                            Bytes::from_static(b"ok"),
                        )))
                    }
                }
            }),
        )
    };
    let req = || payment("u1", Some(b"k")).body(Body::from(BODY)).unwrap();
    assert!(svc(true).oneshot(req()).await.is_err());
    let ok = svc(false).oneshot(req()).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert!(!ok.headers().contains_key("idempotent-replayed"));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let replay = svc(false).oneshot(req()).await.unwrap();
    assert!(replay.headers().contains_key("idempotent-replayed"));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// Under one `Idempotency-Key`, two bodies that differ in any field are two
/// requests (422), also in a field the fingerprint guard ignores to catch
/// double clicks (`timestamp`, `sign`, `random`, `traceId`): those are not
/// for deciding that a different request is the same one (before: the
/// second body got the first one's replay).
async fn a_key_compares_the_whole_body<G: KeyValueStore + Clone>(store: G) {
    let runs = Runs::default();
    let app = app(IdempotencyLayer::new(store.clone()), &runs);
    let first_body = r#"{"orderId":"o1","amount":1999,"timestamp":1}"#;
    assert_eq!(
        pay_with(&app, "u1", "k", first_body).await.status,
        StatusCode::CREATED
    );
    let other = pay_with(
        &app,
        "u1",
        "k",
        r#"{"orderId":"o1","amount":1999,"timestamp":2}"#,
    )
    .await;
    assert_eq!(
        other.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{:?}",
        other.body
    );
    assert_eq!(other.code(), "idempotency_key_mismatch");
    assert!(pay_with(&app, "u1", "k", first_body).await.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A handler that marks its answer [`OutcomeUnknown`] (a 504: its call
/// downstream timed out) leaves the key recorded as such, with the status
/// its client got: every retry, whatever the [`Abandoned`] policy, is 409
/// `idempotency_outcome_unknown` and never runs; an operator reads the
/// record and clears it, and the next retry runs as a new request. Before
/// (a 5xx alone): the key was freed and the retry ran the effect again.
async fn an_unknown_outcome_is_kept_refused_and_cleared_by_an_operator<G: KeyValueStore + Clone>(
    store: G,
) {
    let runs = Runs::default();
    let layer = IdempotencyLayer::new(store.clone()).abandoned(Abandoned::Retry);
    let app = app(layer.clone(), &runs);
    let req = |unknown: bool| {
        let mut b = payment("u1", Some(b"k-unknown"));
        if unknown {
            b = b.header("x-unknown", "1").header("x-status", "504");
        }
        b.body(Body::from(BODY)).unwrap()
    };
    let first = send(&app, req(true)).await;
    assert_eq!(first.status, StatusCode::GATEWAY_TIMEOUT);
    for _ in 0..2 {
        let retry = send(&app, req(false)).await;
        assert_eq!(retry.status, StatusCode::CONFLICT, "{:?}", retry.body);
        assert_eq!(retry.code(), "idempotency_outcome_unknown");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let read = layer
        .inspect("u1", &http::Method::POST, "/payments", "k-unknown")
        .await
        .unwrap()
        .expect("the record is kept");
    assert_eq!(
        read.state,
        RecordState::OutcomeUnknown {
            attempt: 1,
            status: StatusCode::GATEWAY_TIMEOUT
        }
    );
    assert!(
        layer
            .clear("u1", &http::Method::POST, "/payments", "k-unknown", &read)
            .await
            .unwrap()
    );
    assert_eq!(send(&app, req(false)).await.status, StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A repeat that meets an unknown outcome asks the application's lookup:
/// "done" stores and replays its answer (`Idempotency-Reconciled: true`)
/// to this repeat and every later one, without asking again; "absent"
/// takes the key over and runs the handler once, as attempt 2; "unknown"
/// leaves the record as it was (409). Before: every repeat got 409 until
/// the record's retention ended.
async fn an_unknown_outcome_is_reconciled_by_the_applications_lookup<G: KeyValueStore + Clone>(
    store: G,
) {
    let runs = Runs::default();
    let asked = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&asked);
    let layer = IdempotencyLayer::new(store.clone()).reconcile(
        move |_req: &http::request::Parts, key: &str| {
            seen.fetch_add(1, Ordering::SeqCst);
            let answer = match key {
                "k-done" => {
                    let res = http::Response::builder()
                        .status(StatusCode::CREATED)
                        .header("content-type", "application/json")
                        .body(Bytes::from_static(b"{\"paymentId\":\"found\"}"))
                        .unwrap();
                    Reconciled::Done(res)
                }
                "k-absent" => Reconciled::Absent,
                _ => Reconciled::Unknown,
            };
            async move { answer }
        },
    );
    let app = app(layer, &runs);
    let req = |key: &str, unknown: bool| {
        let mut b = payment("u1", Some(key.as_bytes()));
        if unknown {
            b = b.header("x-unknown", "1").header("x-status", "504");
        }
        b.body(Body::from(BODY)).unwrap()
    };
    for key in ["k-done", "k-absent", "k-unknown"] {
        assert_eq!(
            send(&app, req(key, true)).await.status,
            StatusCode::GATEWAY_TIMEOUT
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3);

    for _ in 0..2 {
        let done = send(&app, req("k-done", false)).await;
        assert_eq!(done.status, StatusCode::CREATED, "{:?}", done.body);
        assert_eq!(&done.body[..], b"{\"paymentId\":\"found\"}");
        assert_eq!(done.headers["idempotent-replayed"], "true");
        assert_eq!(done.headers["idempotency-reconciled"], "true");
    }
    assert_eq!(asked.load(Ordering::SeqCst), 1, "asked once, then replayed");

    let absent = send(&app, req("k-absent", false)).await;
    assert_eq!(absent.status, StatusCode::CREATED, "{:?}", absent.body);
    assert!(!absent.headers.contains_key("idempotent-replayed"));
    assert_eq!(
        runs.load(Ordering::SeqCst),
        4,
        "run once more, as attempt 2"
    );
    let again = send(&app, req("k-absent", false)).await;
    assert_eq!(again.headers["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 4);

    for _ in 0..2 {
        let unknown = send(&app, req("k-unknown", false)).await;
        assert_eq!(unknown.status, StatusCode::CONFLICT);
        assert_eq!(unknown.code(), "idempotency_outcome_unknown");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 4);
}

/// `key_from`: a form with no `Idempotency-Key`, keyed by a field of its
/// own; its answer, a 303 to the order (stored: the request was handled),
/// is replayed to the second click, and a form without the field goes on
/// unguarded. Before: 3xx was not stored, the key was released and the
/// second click ran the handler again.
async fn a_key_from_the_form_replays_the_303_to_the_second_click<G: KeyValueStore + Clone>(
    store: G,
) {
    let runs = Runs::default();
    let layer = IdempotencyLayer::new(store).key_from(|_head, body| {
        let form = std::str::from_utf8(body).ok()?;
        form.split('&')
            .find_map(|f| f.strip_prefix("formId="))
            .map(str::to_owned)
    });
    let app = app(layer, &runs);
    let click = |body: &'static str| {
        Request::post("/payments")
            .header("x-user-id", "u1")
            .header("x-status", "303")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(Body::from(body))
            .unwrap()
    };
    let first = send(&app, click("formId=f1&sku=A")).await;
    assert_eq!(first.status, StatusCode::SEE_OTHER);
    let second = send(&app, click("formId=f1&sku=A")).await;
    assert_eq!(second.status, StatusCode::SEE_OTHER);
    assert_eq!(second.headers["location"], first.headers["location"]);
    assert_eq!(second.headers["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        send(&app, click("sku=A")).await.status,
        StatusCode::SEE_OTHER
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2, "no key: unguarded");
}
