// Over 400 lines: the three algorithms on Redis, in memory and as a layer, held to one table of expectations.
//! Rate limiting against real Redis, in memory, and as a tower layer over
//! axum.
//!
//! Over 400 lines: the limiter on Redis, in memory, as a layer and through
//! outages shares its quota and algorithm helpers; the pure arithmetic has
//! its own file (`ratelimit_algorithms.rs`).

// Helpers outside `#[test]` functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::body::Body;
use axum::routing::post;
#[cfg(feature = "redis")]
use futures_util::future::join_all;
use http::{Request, StatusCode};
use norepeat::degrade::FailurePolicy;
use norepeat::ratelimit::{
    Algorithm, ByClientIp, ByUser, Global, PeerAddr, Quota, RateLimitLayer, RateLimiter,
};
use norepeat::store::{
    Fallback, KeyOp, KeyReply, KeyValueStore, MemoryStore, RateDecision, RateOp, RateStore, Store,
    StoreError,
};
use norepeat_testkit::{Answer, send};
use std::num::NonZeroU32;
use std::time::Duration;
#[cfg(feature = "redis")]
use {norepeat::store::RedisStore, norepeat_testkit::RedisServer};

const ALGORITHMS: [Algorithm; 3] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::Gcra,
];

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

// ---------------------------------------------------------------- Redis

#[cfg(feature = "redis")]
/// Two limiters on two connections, 40 concurrent attempts at a quota of
/// 10 in a long window: exactly 10 get through, whatever the algorithm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_one_quota_exactly() {
    let redis = RedisServer::start().await;
    for algorithm in ALGORITHMS {
        let a = RateLimiter::new(
            RedisStore::connect(&redis.url()).await.unwrap(),
            Quota::per_minute(nz(10)),
        )
        .name("shared")
        .algorithm(algorithm);
        let b = RateLimiter::new(
            RedisStore::connect(&redis.url()).await.unwrap(),
            Quota::per_minute(nz(10)),
        )
        .name("shared")
        .algorithm(algorithm);
        let attempts = (0..40).map(|i| {
            let l = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move { l.check("u1").await.unwrap().allowed })
        });
        let admitted = join_all(attempts)
            .await
            .into_iter()
            .filter(|r| *r.as_ref().unwrap())
            .count();
        assert_eq!(admitted, 10, "{algorithm:?}");
        // Another key has its own quota.
        assert!(a.check("u2").await.unwrap().allowed, "{algorithm:?}");
    }
    assert_eq!(redis.keys_without_ttl().await, Vec::<String>::new());
    assert_eq!(redis.dbsize().await, 6);
}

#[cfg(feature = "redis")]
/// Every key the limiter writes expires, and no later than its state
/// matters.
#[tokio::test]
async fn every_key_has_a_ttl() {
    let redis = RedisServer::start().await;
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let mut con = redis.connection().await;
    for algorithm in ALGORITHMS {
        let l = RateLimiter::new(store.clone(), Quota::per_second(nz(2)))
            .name("ttl")
            .algorithm(algorithm);
        for _ in 0..5 {
            l.check("u").await.unwrap();
        }
        let pttl: i64 = redis::cmd("PTTL")
            .arg(l.store_key("u"))
            .query_async(&mut con)
            .await
            .unwrap();
        // Fixed: one window; sliding: two windows; GCRA: until the burst is back.
        assert!(pttl > 0 && pttl <= 2_000, "{algorithm:?}: PTTL {pttl}");
    }
    assert_eq!(redis.keys_without_ttl().await, Vec::<String>::new());
}

#[cfg(feature = "redis")]
/// The Lua scripts and the memory versions agree on simple sequences.
#[tokio::test]
async fn lua_and_memory_agree() {
    let redis = RedisServer::start().await;
    let redis_store = RedisStore::connect(&redis.url()).await.unwrap();
    for algorithm in ALGORITHMS {
        let quota = Quota::per_minute(nz(3));
        let on_redis = run(&redis_store, algorithm, quota).await;
        let in_memory = run(&MemoryStore::default(), algorithm, quota).await;
        let brief = |v: &[RateDecision]| {
            v.iter()
                .map(|d| (d.allowed, d.remaining))
                .collect::<Vec<_>>()
        };
        assert_eq!(brief(&on_redis), brief(&in_memory), "{algorithm:?}");
        assert_eq!(
            brief(&on_redis),
            [(true, 2), (true, 1), (true, 0), (false, 0), (false, 0)],
            "{algorithm:?}"
        );
        // The sliding window is aligned on the store's clock: Redis TIME there,
        // the store's creation in memory, so its resets differ.
        if algorithm == Algorithm::SlidingWindow {
            continue;
        }
        for (r, m) in on_redis.iter().zip(&in_memory) {
            let gap = r.reset.abs_diff(m.reset);
            assert!(
                gap < Duration::from_secs(1),
                "{algorithm:?}: {r:?} vs {m:?}"
            );
        }
    }

    async fn run<S: Store + Clone>(
        store: &S,
        algorithm: Algorithm,
        quota: Quota,
    ) -> Vec<RateDecision> {
        let l = RateLimiter::new(store.clone(), quota)
            .name("agree")
            .algorithm(algorithm);
        let mut out = Vec::new();
        for _ in 0..5 {
            out.push(l.check("u").await.unwrap());
        }
        out
    }
}

#[cfg(feature = "redis")]
/// Calls `l` for `key` until it refuses one (at most `bound` calls);
/// returns how many were admitted.
async fn admitted_until_refused<S: Store>(l: &RateLimiter<S>, key: &str, bound: u32) -> u32 {
    for n in 0..bound {
        if !l.check(key).await.unwrap().allowed {
            return n;
        }
    }
    panic!("{bound} calls and none refused");
}

#[cfg(feature = "redis")]
/// A config change between deployments (`NOREPEAT_FLASH_RATE` from `5/s`
/// to `100/m`, and back): the limiter under its new window admits its whole
/// new quota at once and then refuses with a `Retry-After` within that
/// window. Before, the old counters were read as a window far in the future
/// and the client was locked out.
#[tokio::test]
async fn changing_the_sliding_window_admits_within_the_new_window() {
    let redis = RedisServer::start().await;
    let on_redis = RedisStore::connect(&redis.url()).await.unwrap();
    let in_memory = MemoryStore::default();
    let limiter = |store: AnyOf, rate: &str| {
        let q = Quota::parse(rate).unwrap();
        match store {
            AnyOf::Redis => AnyLimiter::Redis(
                RateLimiter::new(on_redis.clone(), q)
                    .name("flash")
                    .algorithm(Algorithm::SlidingWindow),
            ),
            AnyOf::Memory => AnyLimiter::Memory(
                RateLimiter::new(in_memory.clone(), q)
                    .name("flash")
                    .algorithm(Algorithm::SlidingWindow),
            ),
        }
    };
    for store in [AnyOf::Redis, AnyOf::Memory] {
        for (i, (from, to)) in [("5/s", "100/m"), ("100/m", "5/s")].into_iter().enumerate() {
            let client = format!("client-{i}");
            let old = limiter(store, from);
            assert!(old.admitted_until_refused(&client, 1_000).await > 0);
            let new = limiter(store, to);
            let quota = Quota::parse(to).unwrap();
            let max = quota.max().get();
            for n in 0..max {
                let d = new.check(&client).await;
                assert!(
                    d.allowed,
                    "{store:?} {from} -> {to}: call {n} of {max} refused ({d:?})"
                );
            }
            // Enough of them that the quota is spent even if a window
            // boundary passed meanwhile.
            let refused = loop {
                let d = new.check(&client).await;
                if !d.allowed {
                    break d;
                }
            };
            assert!(
                refused.reset <= 2 * quota.period(),
                "{store:?} {from} -> {to}: retry after {:?}",
                refused.reset
            );
        }
    }

    #[derive(Debug, Clone, Copy)]
    enum AnyOf {
        Redis,
        Memory,
    }
    enum AnyLimiter {
        Redis(RateLimiter<RedisStore>),
        Memory(RateLimiter<MemoryStore>),
    }
    impl AnyLimiter {
        async fn check(&self, key: &str) -> RateDecision {
            match self {
                AnyLimiter::Redis(l) => l.check(key).await.unwrap(),
                AnyLimiter::Memory(l) => l.check(key).await.unwrap(),
            }
        }
        async fn admitted_until_refused(&self, key: &str, bound: u32) -> u32 {
            match self {
                AnyLimiter::Redis(l) => admitted_until_refused(l, key, bound).await,
                AnyLimiter::Memory(l) => admitted_until_refused(l, key, bound).await,
            }
        }
    }
}

#[cfg(feature = "redis")]
/// A refused call does not push the key's expiry further: the state
/// expires when its last window ends, however often a client knocks.
#[tokio::test]
async fn a_refused_sliding_window_call_does_not_extend_its_key() {
    let redis = RedisServer::start().await;
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let mut con = redis.connection().await;
    // An hour's window: no window boundary passes between the two reads.
    let l = RateLimiter::new(store, Quota::per_hour(nz(1)))
        .name("knock")
        .algorithm(Algorithm::SlidingWindow);
    assert_eq!(admitted_until_refused(&l, "u", 10).await, 1);
    let key = l.store_key("u");
    let before = pttl(&mut con, &key).await;
    assert!(before > 0 && before <= 7_200_000, "PTTL {before}");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!l.check("u").await.unwrap().allowed);
    let after = pttl(&mut con, &key).await;
    assert!(
        after < before,
        "a refused call moved the expiry from {before} ms to {after} ms"
    );
}

#[cfg(feature = "redis")]
/// A stored sliding window far ahead of the store's clock (left by another
/// window size, or a clock that jumped) is stale: it is reset, not obeyed.
#[tokio::test]
async fn a_sliding_window_far_ahead_is_stale() {
    let redis = RedisServer::start().await;
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let mut con = redis.connection().await;
    let l = RateLimiter::new(store, Quota::per_second(nz(5)))
        .name("ahead")
        .algorithm(Algorithm::SlidingWindow);
    let key = l.store_key("u");
    // Window index 10^10 of one second: about three centuries from now.
    let _: () = redis::cmd("HSET")
        .arg(&key)
        .arg("i")
        .arg("10000000000")
        .arg("c")
        .arg(1_000)
        .arg("p")
        .arg(1_000)
        .query_async(&mut con)
        .await
        .unwrap();
    let _: () = redis::cmd("PEXPIRE")
        .arg(&key)
        .arg(60_000)
        .query_async(&mut con)
        .await
        .unwrap();
    let d = l.check("u").await.unwrap();
    assert!(d.allowed, "{d:?}");
    assert!(d.reset <= Duration::from_secs(1), "{d:?}");
    let pttl = pttl(&mut con, &key).await;
    assert!(pttl > 0 && pttl <= 2_000, "PTTL {pttl}");
}

#[cfg(feature = "redis")]
async fn pttl(con: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(con).await.unwrap()
}

// ---------------------------------------------------------------- memory

/// The in-memory limiter is bounded by its store's capacity, in bytes.
#[tokio::test]
async fn memory_limiter_is_bounded() {
    let store = MemoryStore::new(MemoryStore::MIN_CAPACITY);
    let l = RateLimiter::new(store.clone(), Quota::per_minute(nz(5)));
    for i in 0..2_000 {
        l.check(&format!("client-{i}")).await.unwrap();
    }
    assert!(store.weighted_size() <= MemoryStore::MIN_CAPACITY);
    assert!(store.len() < 2_000, "{} entries", store.len());
    // The newest client's count is kept: 1 used, 4 left.
    for _ in 0..4 {
        assert!(l.check("client-1999").await.unwrap().allowed);
    }
    assert!(!l.check("client-1999").await.unwrap().allowed);
}

/// It forgets idle keys once their state has expired. moka keeps real time
/// and sweeps expired entries with a timer wheel of about one-second
/// buckets, so this test polls for up to a few seconds; no fake clock
/// reaches into moka.
#[tokio::test]
async fn memory_limiter_forgets_idle_keys() {
    let store = MemoryStore::default();
    let quota = Quota::new(nz(1), Duration::from_millis(20)).unwrap();
    for algorithm in ALGORITHMS {
        let l = RateLimiter::new(store.clone(), quota).algorithm(algorithm);
        for i in 0..10 {
            l.check(&format!("k{i}")).await.unwrap();
        }
    }
    assert_eq!(store.len(), 30);
    let started = std::time::Instant::now();
    while !store.is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{} entries left",
            store.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------- layer

fn post_as(user: Option<&str>) -> Request<Body> {
    let mut b = Request::post("/flash-sale/SKU-1");
    if let Some(u) = user {
        b = b.header("x-user-id", u);
    }
    b.body(Body::from(r#"{"quantity":1}"#)).unwrap()
}

fn app(layer: RateLimitLayer<impl Store + Clone>) -> Router {
    Router::new().route(
        "/flash-sale/{sku}",
        post(|| async { (StatusCode::CREATED, "ordered") }).layer(layer),
    )
}

fn header<'a>(res: &'a Answer, name: &str) -> &'a str {
    res.header(name).unwrap_or_else(|| panic!("no {name}"))
}

#[tokio::test]
async fn layer_answers_429_with_headers_and_a_problem() {
    let limiter = RateLimiter::new(MemoryStore::default(), Quota::per_minute(nz(2))).name("flash");
    let app = app(RateLimitLayer::new(limiter, ByUser::default()));
    for _ in 0..2 {
        let res = send(&app, post_as(Some("u1"))).await;
        assert_eq!(res.status, StatusCode::CREATED);
        assert!(res.headers.get("ratelimit").is_none());
    }
    let res = send(&app, post_as(Some("u1"))).await;
    let body = res.json();
    assert_eq!(res.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "content-type"), "application/problem+json");
    // GCRA at 2/min: one more every 30 s.
    assert_eq!(header(&res, "retry-after"), "30");
    assert_eq!(header(&res, "ratelimit"), r#""flash";r=0;t=30"#);
    assert_eq!(header(&res, "ratelimit-policy"), r#""flash";q=2;w=60"#);
    assert_eq!(body["code"], "rate_limited");
    assert_eq!(body["status"], 429);
    assert!(body["title"].is_string() && body["detail"].is_string());
    assert!(body["type"].as_str().unwrap().ends_with("rate_limited"));
    // Someone else is not affected.
    assert_eq!(
        send(&app, post_as(Some("u2"))).await.status,
        StatusCode::CREATED
    );
}

#[tokio::test]
async fn layer_refuses_a_request_without_a_user_and_counts_nothing() {
    let limiter = RateLimiter::new(MemoryStore::default(), Quota::per_minute(nz(1)));
    let app = app(RateLimitLayer::new(limiter, ByUser::default()));
    let res = send(&app, post_as(None)).await;
    let body = res.json();
    assert_eq!(res.status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["code"], "unauthenticated");
    assert_eq!(
        send(&app, post_as(Some("u1"))).await.status,
        StatusCode::CREATED
    );
}

#[tokio::test]
async fn layer_can_send_the_headers_on_admitted_responses() {
    let limiter = RateLimiter::new(MemoryStore::default(), Quota::per_second(nz(5)))
        .name("flash")
        .algorithm(Algorithm::FixedWindow);
    let app = app(RateLimitLayer::new(limiter, ByUser::default()).headers_on_allowed(true));
    let res = send(&app, post_as(Some("u1"))).await;
    assert_eq!(res.status, StatusCode::CREATED);
    assert_eq!(header(&res, "ratelimit"), r#""flash";r=4;t=1"#);
    assert_eq!(header(&res, "ratelimit-policy"), r#""flash";q=5;w=1"#);
}

/// Per user and global together: all must admit; a caller over their own
/// quota does not spend the global one.
#[tokio::test]
async fn several_quotas_per_route() {
    let store = MemoryStore::default();
    let per_user = RateLimiter::new(store.clone(), Quota::per_minute(nz(2))).name("user");
    let global = RateLimiter::new(store, Quota::per_minute(nz(3))).name("all");
    let app = app(RateLimitLayer::new(per_user, ByUser::default()).and(global, Global));
    let status = |res: &Answer| res.status;
    assert_eq!(
        status(&send(&app, post_as(Some("u1"))).await),
        StatusCode::CREATED
    );
    assert_eq!(
        status(&send(&app, post_as(Some("u1"))).await),
        StatusCode::CREATED
    );
    let res = send(&app, post_as(Some("u1"))).await;
    assert_eq!(res.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "ratelimit"), r#""user";r=0;t=30"#);
    assert_eq!(
        header(&res, "ratelimit-policy"),
        r#""user";q=2;w=60, "all";q=3;w=60"#
    );
    // The global quota still has one left for u2 ...
    assert_eq!(
        status(&send(&app, post_as(Some("u2"))).await),
        StatusCode::CREATED
    );
    // ... and then none.
    let res = send(&app, post_as(Some("u3"))).await;
    let body = res.json();
    assert_eq!(res.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body["code"], "rate_limited");
    assert_eq!(
        header(&res, "ratelimit"),
        r#""user";r=1;t=30, "all";r=0;t=20"#
    );
    assert_eq!(header(&res, "retry-after"), "20");
}

#[tokio::test]
async fn layer_keys_by_client_ip() {
    let limiter = RateLimiter::new(MemoryStore::default(), Quota::per_minute(nz(1)));
    let proxy = "10.0.0.1".parse().unwrap();
    let app = app(RateLimitLayer::new(limiter, ByClientIp::new().trust(proxy)));
    let from = |client: &str| {
        let mut req = Request::post("/flash-sale/SKU-1")
            .header("x-forwarded-for", format!("1.1.1.1, {client}"))
            .body(Body::empty())
            .unwrap();
        req.extensions_mut()
            .insert(PeerAddr("10.0.0.1:40000".parse().unwrap()));
        req
    };
    assert_eq!(
        send(&app, from("203.0.113.1")).await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        send(&app, from("203.0.113.1")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&app, from("203.0.113.2")).await.status,
        StatusCode::CREATED
    );
    // Without the peer's address the key is unknown: a 400, not a 5xx.
    let res = send(&app, post_as(Some("u1"))).await;
    let body = res.json();
    assert_eq!(res.status, StatusCode::BAD_REQUEST);
    assert_eq!(body["code"], "invalid_request");
}

// ---------------------------------------------------------------- outages

/// A store that is always down.
#[derive(Debug, Clone)]
struct Down;

fn down<T>() -> Result<T, StoreError> {
    Err(StoreError::Connection("refused".into()))
}

impl KeyValueStore for Down {
    async fn execute(&self, _: KeyOp<'_>) -> Result<KeyReply, StoreError> {
        down()
    }
    fn kind(&self) -> &'static str {
        "down"
    }
}

impl RateStore for Down {
    async fn rate(&self, _: RateOp<'_>) -> Result<RateDecision, StoreError> {
        down()
    }
}

#[tokio::test]
async fn fail_closed_answers_503() {
    let limiter = RateLimiter::new(Down, Quota::per_second(nz(5)))
        .on_store_failure(FailurePolicy::FailClosed);
    let app = app(RateLimitLayer::new(limiter, ByUser::default()));
    let res = send(&app, post_as(Some("u1"))).await;
    let body = res.json();
    assert_eq!(res.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&res, "retry-after"), "1");
    assert_eq!(body["code"], "guard_unavailable");
}

#[tokio::test]
async fn fail_open_admits() {
    let limiter = RateLimiter::new(Down, Quota::per_minute(nz(1)));
    let app = app(RateLimitLayer::new(limiter, ByUser::default()).headers_on_allowed(true));
    for _ in 0..3 {
        let res = send(&app, post_as(Some("u1"))).await;
        assert_eq!(res.status, StatusCode::CREATED);
        // No decision, so no RateLimit; the policy is still advertised.
        assert!(res.headers.get("ratelimit").is_none());
        assert_eq!(header(&res, "ratelimit-policy"), r#""default";q=1;w=60"#);
    }
}

/// Fail-open to a local limiter: the Fallback store decides in memory while
/// the primary is down, so each instance still enforces the quota.
#[tokio::test]
async fn fail_open_to_a_local_limiter() {
    let store = Fallback::new(Down, MemoryStore::default());
    let limiter = RateLimiter::new(store, Quota::per_minute(nz(1)));
    let app = app(RateLimitLayer::new(limiter, ByUser::default()));
    assert_eq!(
        send(&app, post_as(Some("u1"))).await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        send(&app, post_as(Some("u1"))).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}
