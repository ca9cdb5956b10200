// Over 400 lines on purpose: one comparison (shadowed, then enforced) run for the four layers, with the recorder and request builders they share.
//! Shadow mode (`.shadow(true)`) on the four layers (fingerprint, token,
//! Idempotency-Key, rate limit), on memory and Redis: every request reaches
//! the handler (its runs are counted), each would-refuse is counted exactly
//! once in `norepeat_shadow_total{guard, would}`, and the same traffic
//! through the same layer without shadow mode is refused (or replayed)
//! exactly where shadow mode counted.
//!
//! The counter is read with the test kit's recorder set as the thread's
//! local recorder (`metrics::set_default_local_recorder`): each test runs
//! on tokio's current-thread runtime, so the layers' futures, and the tasks
//! they spawn, run on the test's thread and count into that test's
//! recorder alone, whichever test runner runs the tests side by side. (On a
//! multi-thread runtime a request polled by a worker thread would count into
//! the global recorder instead.)

// A test that cannot build its request or read its answer cannot go on.
#![allow(clippy::unwrap_used)]

use crate::common::{counting_route, each_store};
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::post;
use http::{Request, StatusCode};
use norepeat::fingerprint::{FingerprintGuard, FingerprintLayer};
use norepeat::idempotency::IdempotencyLayer;
use norepeat::keys::KeyBuilder;
use norepeat::ratelimit::{ByUser, Quota, RateLimitLayer, RateLimiter};
use norepeat::shadow::{Shadowed, ShadowedBy};
use norepeat::store::{KeyValueStore, Store};
use norepeat::token::{TokenGuard, TokenLayer, TokenSigner};
use norepeat_testkit::{Answer, Labels, Recorded, post_with_token, send};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// What these tests read of the test kit's recorder.
trait ShadowCounts {
    /// `norepeat_shadow_total` of `guard`, by `would` (only the ones
    /// counted at least once).
    fn shadow(&self, guard: &str) -> BTreeMap<String, u64>;
    /// Every `norepeat_decisions_total` series counted at least once, by
    /// its labels.
    fn decisions(&self) -> BTreeMap<Labels, u64>;
}

impl ShadowCounts for Recorded {
    fn shadow(&self, guard: &str) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for (labels, value) in self.series("norepeat_shadow_total") {
            let label = |k: &str| {
                labels
                    .iter()
                    .find(|(key, _)| key == k)
                    .map(|(_, v)| v.clone())
            };
            assert_eq!(labels.len(), 2, "exactly the labels guard and would");
            if label("guard").as_deref() == Some(guard) {
                let would = label("would").expect("a would label");
                *out.entry(would).or_default() += value;
            }
        }
        out.retain(|_, n| *n > 0);
        out
    }

    fn decisions(&self) -> BTreeMap<Labels, u64> {
        let mut out = self.series("norepeat_decisions_total");
        out.retain(|_, n| *n > 0);
        out
    }
}

/// What the enforcing layer did with a request, as the `would` label names
/// it: `None` when the handler's answer came back.
fn enforced(a: &Answer) -> Option<String> {
    if a.replayed() {
        return Some("replay".to_owned());
    }
    if a.status.is_success() {
        return None;
    }
    Some(match a.code().as_str() {
        "duplicate_submission" => "duplicate".to_owned(),
        "idempotency_key_in_use" => "in_progress".to_owned(),
        "idempotency_key_mismatch" => "mismatch".to_owned(),
        "guard_unavailable" => "unavailable".to_owned(),
        code => code.to_owned(),
    })
}

/// Sends `req` and says which `would` of `guard` it was counted under:
/// `None` when it counted nothing; never more than one.
async fn send_shadowed(
    app: &Router,
    req: Request<Body>,
    counts: &Recorded,
    guard: &str,
) -> (Answer, Option<String>) {
    let before = counts.shadow(guard);
    let res = app.clone().oneshot(req).await.unwrap();
    let by = res.extensions().get::<ShadowedBy>().cloned();
    let answer = Answer::read(res).await;
    let after = counts.shadow(guard);
    let mut counted = Vec::new();
    for (would, n) in &after {
        let grew = n - before.get(would).copied().unwrap_or(0);
        counted.extend(std::iter::repeat_n(
            would.clone(),
            usize::try_from(grew).unwrap(),
        ));
    }
    assert!(counted.len() <= 1, "one request counted {counted:?}");
    // The typed record says what the counter counted: the same guard and
    // would, and nothing on a request that was not counted.
    let typed = by.map(|ShadowedBy(list)| {
        list.iter()
            .map(|s| (s.guard.to_owned(), s.would.to_owned()))
            .collect::<Vec<_>>()
    });
    let want = counted.last().map(|w| vec![(guard.to_owned(), w.clone())]);
    assert_eq!(typed, want, "the response's ShadowedBy");
    (answer, counted.pop())
}

/// The comparison every case makes. `app(shadow)` builds the guarded route
/// on a keyspace of its own (shadow and enforcing runs share the store, not
/// their keys) with a handler that counts its runs in `runs`; `traffic`
/// gives the requests, in order; `expected` says, per request, what the
/// layer would refuse it with (`None`: it passes).
///
/// In shadow mode every request gets the handler's 201 and is counted as
/// expected; enforced, exactly those requests are refused (or replayed),
/// and the handler ran only for the others.
async fn compare<A, T>(guard: &str, app: A, traffic: T, expected: &[Option<&str>])
where
    A: Fn(bool, Arc<AtomicUsize>) -> Router,
    T: Fn(bool) -> Vec<Request<Body>>,
{
    let counts = Recorded::default();
    let _local = metrics::set_default_local_recorder(&counts);
    let expected: Vec<Option<String>> = expected.iter().map(|w| w.map(str::to_owned)).collect();

    let runs = Arc::new(AtomicUsize::new(0));
    let shadowed = app(true, Arc::clone(&runs));
    let decided_before = counts.decisions();
    let mut counted = Vec::new();
    for (i, req) in traffic(true).into_iter().enumerate() {
        let (answer, would) = send_shadowed(&shadowed, req, &counts, guard).await;
        assert_eq!(
            answer.status,
            StatusCode::CREATED,
            "shadow, request {i}: {answer:?}"
        );
        assert!(
            !answer.replayed(),
            "shadow mode never replays (request {i})"
        );
        counted.push(would);
    }
    assert_eq!(
        counted, expected,
        "shadow mode's counts, request by request"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        expected.len(),
        "every request ran"
    );

    let shadow_decided = grown(&decided_before, &counts.decisions());

    let runs = Arc::new(AtomicUsize::new(0));
    let enforcing = app(false, Arc::clone(&runs));
    let before = counts.shadow(guard);
    let decided_before = counts.decisions();
    let mut refused = Vec::new();
    for req in traffic(false) {
        refused.push(enforced(&send(&enforcing, req).await));
    }
    assert_eq!(refused, expected, "enforced, request by request");
    let passed = expected.iter().filter(|w| w.is_none()).count();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        passed,
        "the refused did not run"
    );
    assert_eq!(
        counts.shadow(guard),
        before,
        "an enforcing layer counts no shadow"
    );
    // `norepeat_decisions_total` counts the decisions as taken: a
    // shadowed refusal is counted as the enforced one is.
    assert_eq!(
        shadow_decided,
        grown(&decided_before, &counts.decisions()),
        "norepeat_decisions_total in shadow mode and enforced"
    );
}

/// What grew from `before` to `after`, by series.
fn grown(
    before: &BTreeMap<Vec<(String, String)>, u64>,
    after: &BTreeMap<Vec<(String, String)>, u64>,
) -> BTreeMap<Vec<(String, String)>, u64> {
    after
        .iter()
        .map(|(k, n)| (k.clone(), n - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

fn keys(shadow: bool) -> KeyBuilder {
    KeyBuilder::new(if shadow { "shadow" } else { "enforced" })
}

fn order(user: Option<&str>, body: &str) -> Request<Body> {
    let mut req = Request::post("/orders").header("content-type", "application/json");
    if let Some(user) = user {
        req = req.header("x-user-id", user);
    }
    req.body(Body::from(body.to_owned())).unwrap()
}

// ------------------------------------------------------------ fingerprint --

async fn fingerprint_repeats_pass_and_are_counted<G: Store + Clone>(store: G) {
    let app = |shadow: bool, runs: Arc<AtomicUsize>| {
        let guard = FingerprintGuard::new(store.clone())
            .window(Duration::from_secs(60))
            .keys(keys(shadow));
        counting_route(FingerprintLayer::new(guard).shadow(shadow), runs)
    };
    let traffic = |_: bool| {
        vec![
            order(Some("u1"), r#"{"sku":"A"}"#),
            order(Some("u1"), r#"{"sku":"A"}"#),
            order(Some("u1"), r#"{"sku":"B"}"#),
            order(Some("u1"), r#"{"sku":"B","traceId":"2"}"#),
            order(Some("u2"), r#"{"sku":"A"}"#),
            order(Some("u1"), r#"{"sku":"A"}"#),
            order(None, r#"{"sku":"A"}"#),
            order(Some("u1"), r#"{"sku":"#),
        ]
    };
    let expected = [
        None,
        Some("duplicate"),
        None,
        Some("duplicate"),
        None,
        Some("duplicate"),
        Some("unauthenticated"),
        Some("invalid_request"),
    ];
    compare("fingerprint", app, traffic, &expected).await;
}

/// A body announced over the cap is handed on whole in shadow mode (its
/// bytes were never read); enforced, it is 413.
async fn fingerprint_an_announced_large_body_passes_whole<G: Store + Clone>(store: G) {
    let seen = Arc::new(AtomicUsize::new(0));
    let app = |shadow| {
        let guard = FingerprintGuard::new(store.clone()).keys(keys(shadow));
        let seen = Arc::clone(&seen);
        Router::new().route(
            "/orders",
            post(move |body: axum::body::Bytes| async move {
                seen.store(body.len(), Ordering::SeqCst);
                StatusCode::CREATED
            })
            .layer(FingerprintLayer::new(guard).max_body(16).shadow(shadow)),
        )
    };
    let big = || {
        Request::post("/orders")
            .header("x-user-id", "u1")
            .header("content-length", "32")
            .body(Body::from(vec![b'x'; 32]))
            .unwrap()
    };
    let counts = Recorded::default();
    let _local = metrics::set_default_local_recorder(&counts);
    let (answer, would) = send_shadowed(&app(true), big(), &counts, "fingerprint").await;
    assert_eq!(answer.status, StatusCode::CREATED);
    assert_eq!(would.as_deref(), Some("payload_too_large"));
    assert_eq!(
        seen.load(Ordering::SeqCst),
        32,
        "the handler got the whole body"
    );
    let answer = send(&app(false), big()).await;
    assert_eq!(enforced(&answer).as_deref(), Some("payload_too_large"));
}

// ------------------------------------------------------------------ token --

async fn token_refusals_pass_and_are_counted<G: Store + Clone>(store: G) {
    // One signer for both runs: a token is spent in one keyspace only.
    let signer = TokenSigner::random();
    let tokens = |shadow: bool| TokenGuard::new(store.clone(), signer.clone()).keys(keys(shadow));
    let app = |shadow: bool, runs: Arc<AtomicUsize>| {
        counting_route(TokenLayer::new(tokens(shadow)).shadow(shadow), runs)
    };
    let with = |user: Option<&str>, token: Option<&str>| {
        let mut req = Request::post("/orders");
        if let Some(user) = user {
            req = req.header("x-user-id", user);
        }
        if let Some(token) = token {
            req = req.header("repeat-token", token);
        }
        req.body(Body::empty()).unwrap()
    };
    let traffic = |shadow: bool| {
        let guard = tokens(shadow);
        let (t1, t2) = (guard.issue("u1").token, guard.issue("u1").token);
        let other = guard.issue("u2").token;
        vec![
            with(Some("u1"), Some(&t1)),
            with(Some("u1"), Some(&t1)),
            with(Some("u1"), None),
            with(Some("u1"), Some("not-a-token")),
            with(Some("u1"), Some(&other)),
            with(Some("u1"), Some(&t2)),
            with(None, Some(&t2)),
            with(Some("u2"), Some(&other)),
        ]
    };
    let expected = [
        None,
        Some("duplicate"),
        Some("missing_token"),
        Some("duplicate"),
        Some("duplicate"),
        None,
        Some("unauthenticated"),
        None,
    ];
    compare("token", app, traffic, &expected).await;
}

// ------------------------------------------------------------ idempotency --

fn payment(user: Option<&str>, key: Option<&str>, body: &str) -> Request<Body> {
    let mut req = Request::post("/orders").header("content-type", "application/json");
    if let Some(user) = user {
        req = req.header("x-user-id", user);
    }
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    req.body(Body::from(body.to_owned())).unwrap()
}

async fn idempotency_repeats_run_and_are_counted<G: KeyValueStore + Clone>(store: G) {
    let app = |shadow: bool, runs: Arc<AtomicUsize>| {
        let layer = IdempotencyLayer::new(store.clone())
            .keys(keys(shadow))
            .shadow(shadow);
        counting_route(layer, runs)
    };
    let traffic = |_: bool| {
        vec![
            payment(Some("u1"), Some("k1"), r#"{"amount":1}"#),
            payment(Some("u1"), Some("k1"), r#"{"amount":1}"#),
            payment(Some("u1"), Some("k1"), r#"{"amount":2}"#),
            payment(Some("u1"), None, r#"{"amount":1}"#),
            payment(Some("u1"), Some("a b"), r#"{"amount":1}"#),
            payment(None, Some("k1"), r#"{"amount":1}"#),
            payment(Some("u1"), Some("k2"), r#"{"amount":"#),
            payment(Some("u2"), Some("k1"), r#"{"amount":1}"#),
            payment(Some("u1"), Some("k1"), r#"{"amount":1}"#),
        ]
    };
    let expected = [
        None,
        Some("replay"),
        Some("mismatch"),
        Some("missing_idempotency_key"),
        Some("invalid_idempotency_key"),
        Some("unauthenticated"),
        Some("invalid_request"),
        None,
        Some("replay"),
    ];
    compare("idempotency", app, traffic, &expected).await;
}

/// A repeat while the first request with its key still runs: in shadow
/// mode it runs too (`in_progress`), and the first one's response is the
/// one stored; enforced, it is 409. The first request holds a permit of
/// `gate` open until the test lets it go.
async fn idempotency_a_repeat_of_a_running_request_runs<G: KeyValueStore + Clone>(store: G) {
    #[derive(Clone)]
    struct Gate {
        runs: Arc<AtomicUsize>,
        gate: Arc<Semaphore>,
    }
    async fn slow(State(g): State<Gate>) -> (StatusCode, String) {
        let run = g.runs.fetch_add(1, Ordering::SeqCst);
        let _permit = g.gate.acquire().await.expect("never closed");
        (StatusCode::CREATED, format!("run {run}"))
    }
    let counts = Recorded::default();
    let _local = metrics::set_default_local_recorder(&counts);
    for shadow in [true, false] {
        let gate = Gate {
            runs: Arc::new(AtomicUsize::new(0)),
            gate: Arc::new(Semaphore::new(0)),
        };
        // Shadowed, a wait for the first one's result is not taken: the
        // repeat would otherwise sit until the gate opens (and `until`
        // below time out).
        let wait = if shadow {
            Duration::from_secs(60)
        } else {
            Duration::ZERO
        };
        let layer = IdempotencyLayer::new(store.clone())
            .keys(keys(shadow))
            .wait_for_result(wait)
            .shadow(shadow);
        let app = Router::new()
            .route("/orders", post(slow).layer(layer))
            .with_state(gate.clone());
        let pay = || payment(Some("u1"), Some("k1"), r#"{"amount":1}"#);
        let first = tokio::spawn({
            let app = app.clone();
            async move { send(&app, pay()).await }
        });
        until(|| gate.runs.load(Ordering::SeqCst) == 1).await;
        let second = tokio::spawn({
            let app = app.clone();
            async move { send(&app, pay()).await }
        });
        // Shadowed, the repeat reaches the handler too; enforced, it is
        // answered at once.
        until(|| gate.runs.load(Ordering::SeqCst) == 2 || second.is_finished()).await;
        gate.gate.add_permits(2);
        let (first, second) = (first.await.unwrap(), second.await.unwrap());
        assert_eq!(first.status, StatusCode::CREATED);
        assert_eq!(first.text(), "run 0");
        if shadow {
            assert_eq!(second.status, StatusCode::CREATED);
            assert_eq!(second.text(), "run 1", "the repeat ran, not replayed");
            assert_eq!(counts.shadow("idempotency")["in_progress"], 1);
        } else {
            assert_eq!(enforced(&second).as_deref(), Some("in_progress"));
            assert_eq!(gate.runs.load(Ordering::SeqCst), 1);
        }
        // The first one's response is the record, in either mode: enforced,
        // the next repeat gets it back.
        let replay = send(&app, pay()).await;
        if shadow {
            assert_eq!(replay.text(), "run 2");
            // The record the shadowed layer kept is the first one's: an
            // enforcing layer on the same keys replays run 0, not a repeat.
            let enforcing = Router::new()
                .route(
                    "/orders",
                    post(slow).layer(IdempotencyLayer::new(store.clone()).keys(keys(true))),
                )
                .with_state(gate.clone());
            let replay = send(&enforcing, pay()).await;
            assert!(replay.replayed(), "{replay:?}");
            assert_eq!(replay.text(), "run 0");
        } else {
            assert!(replay.replayed());
            assert_eq!(replay.text(), "run 0");
        }
    }
    assert_eq!(
        counts.shadow("idempotency").len(),
        2,
        "in_progress and replay"
    );
    assert_eq!(counts.shadow("idempotency")["replay"], 1);
}

/// A shadowed repeat runs in its caller's future, unclaimed: it takes no
/// slot of `max_detached`, which bounds the handlers that own a key. With
/// two slots, a running owner and its running shadowed repeat leave one
/// for a new key, which is claimed (and its repeat replayed when
/// enforced), not counted `unavailable` and run unguarded.
async fn idempotency_a_shadowed_repeat_takes_no_slot<G: KeyValueStore + Clone>(store: G) {
    #[derive(Clone)]
    struct Gate {
        runs: Arc<AtomicUsize>,
        gate: Arc<Semaphore>,
    }
    async fn slow(State(g): State<Gate>) -> (StatusCode, String) {
        let run = g.runs.fetch_add(1, Ordering::SeqCst);
        let _permit = g.gate.acquire().await.expect("never closed");
        (StatusCode::CREATED, format!("run {run}"))
    }
    let counts = Recorded::default();
    let _local = metrics::set_default_local_recorder(&counts);
    let gate = Gate {
        runs: Arc::new(AtomicUsize::new(0)),
        gate: Arc::new(Semaphore::new(0)),
    };
    let layer = IdempotencyLayer::new(store.clone())
        .keys(keys(true))
        .max_detached(2)
        .shadow(true);
    let app = Router::new()
        .route("/orders", post(slow).layer(layer))
        .with_state(gate.clone());
    let pay = |key: &'static str| payment(Some("u1"), Some(key), r#"{"amount":1}"#);
    let spawn = |key: &'static str| {
        let app = app.clone();
        tokio::spawn(async move { send(&app, pay(key)).await })
    };
    let owner = spawn("k1");
    until(|| gate.runs.load(Ordering::SeqCst) == 1).await;
    let repeat = spawn("k1");
    until(|| gate.runs.load(Ordering::SeqCst) == 2).await;
    let other = spawn("k2");
    until(|| gate.runs.load(Ordering::SeqCst) == 3).await;
    gate.gate.add_permits(3);
    for task in [owner, repeat, other] {
        assert_eq!(task.await.unwrap().status, StatusCode::CREATED);
    }
    let shadow = counts.shadow("idempotency");
    assert_eq!(shadow.get("in_progress"), Some(&1), "{shadow:?}");
    assert_eq!(
        shadow.get("unavailable"),
        None,
        "k2 found a slot: {shadow:?}"
    );
    // k2 was claimed and its answer stored: its repeat would be a replay.
    let (_, would) = send_shadowed(&app, pay("k2"), &counts, "idempotency").await;
    assert_eq!(would.as_deref(), Some("replay"));
}

/// Polls `done` for up to 10 s (a busy machine), every 5 ms.
async fn until(done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(10), "timed out");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

// ------------------------------------------------------------- rate limit --

/// GCRA (the default), not a fixed window: a window that ends mid-run
/// would reset the counts between the shadowed and the enforced run.
async fn rate_limit_refusals_pass_and_are_counted<G: Store + Clone>(store: G) {
    let app = |shadow: bool, runs: Arc<AtomicUsize>| {
        let per_user = RateLimiter::new(store.clone(), Quota::parse("2/m").unwrap())
            .keys(keys(shadow))
            .name("user");
        let total = RateLimiter::new(store.clone(), Quota::parse("4/m").unwrap())
            .keys(keys(shadow))
            .name("all");
        let layer = RateLimitLayer::new(per_user, ByUser::default())
            .and(total, norepeat::ratelimit::Global)
            .shadow(shadow);
        counting_route(layer, runs)
    };
    let traffic = |_: bool| {
        [
            "u1", "u1", "u1", "u1", "u2", "", "u3", "u3", "u2", "u4", "u2",
        ]
        .into_iter()
        .map(|u| order((!u.is_empty()).then_some(u), "{}"))
        .collect()
    };
    // u1's own quota refuses its third and fourth, which so spend nothing
    // of the shared one; that one (4) is full after u3's first: u3's
    // second, u2's second and u4's first are over it, u2's third over its
    // own. The request without a caller is counted nowhere.
    let expected = [
        None,
        None,
        Some("rate_limited"),
        Some("rate_limited"),
        None,
        Some("unauthenticated"),
        None,
        Some("rate_limited"),
        Some("rate_limited"),
        Some("rate_limited"),
        Some("rate_limited"),
    ];
    compare("rate_limit", app, traffic, &expected).await;
}

// ------------------------------------------------------ switching it off --

/// What shadow mode decided stays in the store: a layer switched to
/// enforcing on the same keys refuses (or replays) the repeat of a request
/// that passed in shadow mode: the fingerprint is held, the token spent,
/// the response stored, the quota spent.
async fn switching_shadow_off_keeps_what_shadow_decided<G: Store + Clone>(store: G) {
    let signer = TokenSigner::random();
    let token = TokenGuard::new(store.clone(), signer.clone())
        .issue("u1")
        .token;
    let apps = |shadow: bool, runs: &Arc<AtomicUsize>| {
        let fingerprint = FingerprintGuard::new(store.clone())
            .window(Duration::from_secs(60))
            .keys(keys(true));
        let tokens = TokenGuard::new(store.clone(), signer.clone()).keys(keys(true));
        let limiter =
            RateLimiter::new(store.clone(), Quota::parse("1/m").unwrap()).keys(keys(true));
        let idempotency = IdempotencyLayer::new(store.clone())
            .keys(keys(true))
            .shadow(shadow);
        let r = || Arc::clone(runs);
        let fingerprint = FingerprintLayer::new(fingerprint).shadow(shadow);
        let limit = RateLimitLayer::new(limiter, ByUser::default()).shadow(shadow);
        [
            ("fingerprint", counting_route(fingerprint, r()), None),
            (
                "token",
                counting_route(TokenLayer::new(tokens).shadow(shadow), r()),
                None,
            ),
            (
                "idempotency",
                counting_route(idempotency, r()),
                Some("replay"),
            ),
            (
                "rate_limit",
                counting_route(limit, r()),
                Some("rate_limited"),
            ),
        ]
    };
    let request = || {
        post_with_token("/orders", "u1", &token)
            .header("idempotency-key", "k1")
            .body(Body::empty())
            .unwrap()
    };
    let runs = Arc::new(AtomicUsize::new(0));
    for (guard, app, _) in apps(true, &runs) {
        assert_eq!(
            send(&app, request()).await.status,
            StatusCode::CREATED,
            "{guard}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    for (guard, app, would) in apps(false, &runs) {
        let answer = send(&app, request()).await;
        let would = would.unwrap_or("duplicate");
        assert_eq!(
            enforced(&answer).as_deref(),
            Some(would),
            "{guard}: {answer:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 4, "enforced, none ran again");
}

// ------------------------------------------------------ the store is down --

/// Redis killed, every layer fail-closed: enforced, each answers 503
/// `guard_unavailable`; shadowed, each request runs and is counted
/// `unavailable`. (A fail-open layer passes in either mode: nothing to
/// count.)
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_fail_closed_store_that_fails_passes_and_is_counted() {
    use norepeat::degrade::FailurePolicy::FailClosed;
    use norepeat::store::{RedisStore, Resilient};

    let mut redis = norepeat_testkit::RedisServer::start().await;
    let store = Resilient::new(RedisStore::connect(&redis.url()).await.unwrap())
        .timeout(Duration::from_millis(100));
    let signer = TokenSigner::random();
    let token = TokenGuard::new(norepeat::store::MemoryStore::default(), signer.clone())
        .issue("u1")
        .token;
    let apps = |shadow: bool, runs: &Arc<AtomicUsize>| {
        let fingerprint = FingerprintGuard::new(store.clone()).on_store_failure(FailClosed);
        let tokens = TokenGuard::new(store.clone(), signer.clone()).on_store_failure(FailClosed);
        let limiter = RateLimiter::new(store.clone(), Quota::parse("5/s").unwrap())
            .on_store_failure(FailClosed);
        let idempotency = IdempotencyLayer::new(store.clone()).shadow(shadow);
        let r = || Arc::clone(runs);
        [
            (
                "fingerprint",
                counting_route(FingerprintLayer::new(fingerprint).shadow(shadow), r()),
            ),
            (
                "token",
                counting_route(TokenLayer::new(tokens).shadow(shadow), r()),
            ),
            ("idempotency", counting_route(idempotency, r())),
            (
                "rate_limit",
                counting_route(
                    RateLimitLayer::new(limiter, ByUser::default()).shadow(shadow),
                    r(),
                ),
            ),
        ]
    };
    let request = || {
        post_with_token("/orders", "u1", &token)
            .header("idempotency-key", "k1")
            .body(Body::empty())
            .unwrap()
    };
    redis.kill();

    let counts = Recorded::default();
    let _local = metrics::set_default_local_recorder(&counts);
    let runs = Arc::new(AtomicUsize::new(0));
    for (guard, app) in apps(true, &runs) {
        let (answer, would) = send_shadowed(&app, request(), &counts, guard).await;
        assert_eq!(answer.status, StatusCode::CREATED, "{guard}: {answer:?}");
        assert_eq!(would.as_deref(), Some("unavailable"), "{guard}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    for (guard, app) in apps(false, &runs) {
        let answer = send(&app, request()).await;
        assert_eq!(enforced(&answer).as_deref(), Some("unavailable"), "{guard}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 4, "enforced, none ran");
}

// -------------------------------------------------------- stacked layers --

/// Two shadowed layers that both would refuse: the response carries both
/// decisions, the inner layer's first; the outer one adds, never replaces.
#[tokio::test]
async fn stacked_shadowed_layers_keep_every_decision() {
    let store = norepeat::store::MemoryStore::default();
    let tokens = TokenGuard::new(store.clone(), TokenSigner::random());
    let limiter = RateLimiter::new(store, Quota::parse("1/m").unwrap());
    let runs = Arc::new(AtomicUsize::new(0));
    let app = counting_route(TokenLayer::new(tokens).shadow(true), Arc::clone(&runs))
        .layer(RateLimitLayer::new(limiter, ByUser::default()).shadow(true));
    let by = |res: &http::Response<Body>| res.extensions().get::<ShadowedBy>().cloned();
    // The first: within the quota, no token.
    let res = app.clone().oneshot(order(Some("u1"), "{}")).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let token = Shadowed {
        guard: "token",
        would: "missing_token",
    };
    assert_eq!(by(&res), Some(ShadowedBy(vec![token])));
    // The second: over the quota too.
    let res = app.clone().oneshot(order(Some("u1"), "{}")).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let limit = Shadowed {
        guard: "rate_limit",
        would: "rate_limited",
    };
    assert_eq!(by(&res), Some(ShadowedBy(vec![token, limit])));
    assert_eq!(runs.load(Ordering::SeqCst), 2, "both reached the handler");
}

each_store!(
    fingerprint_repeats_pass_and_are_counted,
    fingerprint_an_announced_large_body_passes_whole,
    token_refusals_pass_and_are_counted,
    idempotency_repeats_run_and_are_counted,
    idempotency_a_repeat_of_a_running_request_runs,
    idempotency_a_shadowed_repeat_takes_no_slot,
    rate_limit_refusals_pass_and_are_counted,
    switching_shadow_off_keeps_what_shadow_decided,
);
