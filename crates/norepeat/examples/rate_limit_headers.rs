//! GCRA rate limiting per user, with the IETF `RateLimit` and
//! `RateLimit-Policy` headers (on a 429 always, on admitted answers when
//! asked) and `Retry-After` on a 429.
//!
//! ```sh
//! cargo run --example rate_limit_headers
//! ```
//!
//! The store is memory (one process); `RedisStore` shares the limit across
//! every instance.

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use norepeat::ratelimit::{Algorithm, ByUser, Quota, RateLimitLayer, RateLimiter};
use norepeat::store::MemoryStore;
use tower::ServiceExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 3 requests a minute per user, GCRA (the default algorithm; also
    // `Algorithm::FixedWindow` and `Algorithm::SlidingWindow`).
    let limiter = RateLimiter::new(MemoryStore::default(), Quota::parse("3/m")?)
        .algorithm(Algorithm::Gcra)
        .name("flash");
    let app = Router::new().route(
        "/flash-sale/{sku}",
        post(|| async { "ordered" })
            .layer(RateLimitLayer::new(limiter, ByUser::default()).headers_on_allowed(true)),
    );
    let buy = |user: &str| {
        Request::post("/flash-sale/SKU-1")
            .header("x-user-id", user)
            .body(Body::empty())
            .expect("a valid request")
    };

    for n in 1..=4 {
        let res = app.clone().oneshot(buy("u1")).await?;
        let header = |name: &str| {
            res.headers()
                .get(name)
                .map_or("-", |v| v.to_str().unwrap_or("?"))
                .to_owned()
        };
        println!(
            "u1 request {n}: {} RateLimit: {} | RateLimit-Policy: {} | Retry-After: {}",
            res.status(),
            header("ratelimit"),
            header("ratelimit-policy"),
            header("retry-after"),
        );
        let expected = if n <= 3 {
            StatusCode::OK
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        assert_eq!(res.status(), expected);
        assert_eq!(header("ratelimit-policy"), r#""flash";q=3;w=60"#);
    }
    // Another user has an allowance of their own.
    let other = app.oneshot(buy("u2")).await?;
    println!("u2 request 1: {}", other.status());
    assert_eq!(other.status(), StatusCode::OK);
    Ok(())
}
