//! A caller that gives up half-way never turns a retry into a second
//! effect (issue 13, item 4), and two concrete paths under one route
//! template are two resources (item 7). Against the memory store and a real
//! Redis.
//!
//! Each handler writes its effect after its first await; its caller is
//! dropped as soon as the write is seen (the test drops the call's future,
//! as hyper does when the client disconnects), polled rather than after a
//! fixed delay so a busy machine cannot drop it before the write; then the
//! retry comes.

// Test helpers outside #[test] functions unwrap too: a failure there is a failed test.
#![allow(clippy::unwrap_used)]

use crate::common::Error;
use crate::common::{drop_when, eventually, with_stores};
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::post;
use http::{Request, StatusCode};
use norepeat::attribute::{Guarded, Rejected};
use norepeat::fingerprint::{FingerprintGuard, FingerprintLayer};
use norepeat::idempotency::IdempotencyLayer;
use norepeat::store::AnyStore;
use norepeat_testkit::send;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// Before the effect: the handler's first await.
const BEFORE: Duration = Duration::from_millis(30);
/// After the effect: the rest of the handler.
const AFTER: Duration = Duration::from_millis(300);

type Effects = Arc<AtomicU32>;

/// Awaits, writes its effect, awaits again, answers 201 with the effect's
/// number.
async fn effect(State(effects): State<Effects>) -> (StatusCode, String) {
    tokio::time::sleep(BEFORE).await;
    let n = effects.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::time::sleep(AFTER).await;
    (StatusCode::CREATED, format!(r#"{{"effect":{n}}}"#))
}

/// An effect counter whose handler, once the effect is written, waits
/// for the test to open the gate: "the first one still runs" is then a
/// fact, not a race with a timer on a busy machine.
struct Gated {
    effects: AtomicU32,
    gate: Semaphore,
}

impl Gated {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            effects: AtomicU32::new(0),
            gate: Semaphore::new(0),
        })
    }

    fn effects(&self) -> u32 {
        self.effects.load(Ordering::SeqCst)
    }

    /// Awaits, writes the effect, waits for the gate; the effect's number.
    async fn run(&self) -> u32 {
        tokio::time::sleep(BEFORE).await;
        let n = self.effects.fetch_add(1, Ordering::SeqCst) + 1;
        // Closed by `open`: the error is the go-ahead.
        let _ = self.gate.acquire().await;
        n
    }

    /// Lets every run (and every later one) end.
    fn open(&self) {
        self.gate.close();
    }
}

async fn gated_effect(State(run): State<Arc<Gated>>) -> (StatusCode, String) {
    let n = run.run().await;
    (StatusCode::CREATED, format!(r#"{{"effect":{n}}}"#))
}

fn post_to(path: &str, key: Option<&str>) -> Request<Body> {
    let mut b = Request::post(path)
        .header("x-user-id", "u1")
        .header("content-type", "application/json");
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    b.body(Body::from(r#"{"amount":5}"#)).unwrap()
}

/// Sends `req` and drops it once its effect is written, before the
/// handler ends (it fails if the handler ends first).
async fn give_up(app: &Router, req: Request<Body>, effects: &Effects) {
    drop_when(app.clone().oneshot(req), "the effect is written", || {
        effects.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(effects.load(Ordering::SeqCst), 1, "the effect was written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_a_dropped_request_runs_to_its_end_and_the_retry_gets_its_answer() {
    with_stores(|store| async move {
        let run = Gated::new();
        let layer = IdempotencyLayer::new(store).lease(Duration::from_millis(600));
        let app = Router::new()
            .route("/payments", post(gated_effect).layer(layer))
            .with_state(Arc::clone(&run));
        let req = post_to("/payments", Some("k1"));
        drop_when(app.clone().oneshot(req), "the effect is written", || {
            run.effects() == 1
        })
        .await;

        // The retry: the first one still runs (held at its gate, past its
        // 600 ms lease, which is renewed).
        let retry = send(&app, post_to("/payments", Some("k1"))).await;
        assert_eq!(retry.status, StatusCode::CONFLICT, "{:?}", retry.body);
        assert_eq!(retry.json()["code"], "idempotency_key_in_use");
        run.open();
        // Once it has ended, its stored answer.
        let replay = eventually("the first one has ended", || async {
            let a = send(&app, post_to("/payments", Some("k1"))).await;
            (a.status != StatusCode::CONFLICT).then_some(a)
        })
        .await;
        assert_eq!(replay.status, StatusCode::CREATED, "{:?}", replay.body);
        assert!(replay.replayed(), "the retry ran the handler again");
        assert_eq!(replay.json()["effect"], 1);
        assert_eq!(run.effects(), 1);
    })
    .await;
}

/// Shadow mode takes the same claims: a shadowed request whose caller
/// gave up runs to its end and its answer is stored, so the enforcing
/// layer that replaces the shadowed one replays it, never runs it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_shadowed_a_dropped_request_runs_to_its_end_and_is_kept() {
    with_stores(|store| async move {
        let run = Gated::new();
        let route = |layer: IdempotencyLayer<AnyStore>| {
            Router::new()
                .route("/payments", post(gated_effect).layer(layer))
                .with_state(Arc::clone(&run))
        };
        let shadowed = route(IdempotencyLayer::new(store.clone()).shadow(true));
        let req = post_to("/payments", Some("k1"));
        drop_when(shadowed.oneshot(req), "the effect is written", || {
            run.effects() == 1
        })
        .await;
        run.open();

        let enforcing = route(IdempotencyLayer::new(store));
        let replay = eventually("the dropped run has ended", || async {
            let a = send(&enforcing, post_to("/payments", Some("k1"))).await;
            (a.status != StatusCode::CONFLICT).then_some(a)
        })
        .await;
        assert_eq!(replay.status, StatusCode::CREATED, "{:?}", replay.body);
        assert!(replay.replayed(), "the enforcing layer ran it again");
        assert_eq!(replay.json()["effect"], 1);
        assert_eq!(run.effects(), 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fingerprint_a_dropped_request_holds_its_key_for_the_window() {
    with_stores(|store| async move {
        let effects = Effects::default();
        // A window far longer than the test: the retries below prove the
        // key is still held, and must not outlast it on a slow machine.
        let guard = FingerprintGuard::new(store).window(Duration::from_secs(30));
        let app = Router::new()
            .route("/orders", post(effect).layer(FingerprintLayer::new(guard)))
            .with_state(Arc::clone(&effects));
        give_up(&app, post_to("/orders", None), &effects).await;
        for _ in 0..2 {
            let retry = send(&app, post_to("/orders", None)).await;
            assert_eq!(retry.status, StatusCode::CONFLICT, "{:?}", retry.body);
            assert_eq!(retry.json()["code"], "duplicate_submission");
            // Also once the dropped handler would have ended. (A bounded
            // wait: it shows the key is NOT freed, which no condition can
            // signal.)
            tokio::time::sleep(AFTER).await;
        }
        assert_eq!(effects.load(Ordering::SeqCst), 1);
    })
    .await;
}

struct Ledger {
    store: AnyStore,
    effects: AtomicU32,
}

impl Ledger {
    #[norepeat::guard(store = self.store, key = "{order}", mode = once, lease = "30s")]
    async fn award(&self, order: &str) -> Result<u32, Error> {
        tokio::time::sleep(BEFORE).await;
        let n = self.effects.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::time::sleep(AFTER).await;
        Ok(n)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_a_dropped_call_keeps_its_claim() {
    with_stores(|store| async move {
        let ledger = Ledger {
            store,
            effects: AtomicU32::new(0),
        };
        // The lease (30 s) outlasts the test: the retries below prove the
        // claim is kept, and a slow machine must not let it run out first.
        drop_when(ledger.award("o1"), "the effect is written", || {
            ledger.effects.load(Ordering::SeqCst) == 1
        })
        .await;
        assert_eq!(ledger.effects.load(Ordering::SeqCst), 1);
        for _ in 0..2 {
            assert_eq!(
                ledger.award("o1").await,
                Err(Error::Refused(Rejected::InProgress))
            );
            // Bounded, as above: the claim must NOT be freed.
            tokio::time::sleep(AFTER).await;
        }
        assert_eq!(ledger.effects.load(Ordering::SeqCst), 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_detached_a_dropped_call_runs_to_its_end_and_is_replayed() {
    with_stores(|store| async move {
        let run = Gated::new();
        let once = Guarded::once("tests::award").lease(Duration::from_millis(600));
        let call = || {
            let run = Arc::clone(&run);
            once.run_once_detached(
                &store,
                "o1",
                async move { Ok::<u32, Error>(run.run().await) },
            )
        };
        drop_when(call(), "the effect is written", || run.effects() == 1).await;
        assert_eq!(run.effects(), 1);
        // Held at its gate: still running.
        assert_eq!(call().await, Err(Error::Refused(Rejected::InProgress)));
        run.open();
        let stored = eventually("the detached run has ended", || async {
            let out = call().await;
            (out != Err(Error::Refused(Rejected::InProgress))).then_some(out)
        })
        .await;
        assert_eq!(stored, Ok(1), "the stored result");
        assert_eq!(run.effects(), 1);
    })
    .await;
}

/// `/orders/1/pay` and `/orders/2/pay` under the template
/// `/orders/{id}/pay`, with one key and one body: two payments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_concrete_paths_under_one_template_are_two_resources() {
    with_stores(|store| async move {
        let template = "/orders/{id}/pay";
        let effects = Effects::default();
        let idem = IdempotencyLayer::new(store.clone()).route(template);
        let fp = FingerprintLayer::new(FingerprintGuard::new(store)).route("/quick/{id}/pay");
        let app = Router::new()
            .route(template, post(effect).layer(idem))
            .route("/quick/{id}/pay", post(effect).layer(fp))
            .with_state(Arc::clone(&effects));

        for id in [1, 2] {
            let a = send(&app, post_to(&format!("/orders/{id}/pay"), Some("k1"))).await;
            assert_eq!(a.status, StatusCode::CREATED, "order {id}: {:?}", a.body);
            assert!(!a.replayed(), "order {id} got another order's answer");
        }
        let again = send(&app, post_to("/orders/1/pay", Some("k1"))).await;
        assert!(again.replayed());
        assert_eq!(again.json()["effect"], 1);
        assert_eq!(effects.load(Ordering::SeqCst), 2);

        for id in [1, 2] {
            let a = send(&app, post_to(&format!("/quick/{id}/pay"), None)).await;
            assert_eq!(a.status, StatusCode::CREATED, "quick {id}: {:?}", a.body);
        }
        let dup = send(&app, post_to("/quick/2/pay", None)).await;
        assert_eq!(dup.status, StatusCode::CONFLICT);
        assert_eq!(effects.load(Ordering::SeqCst), 4);
    })
    .await;
}
