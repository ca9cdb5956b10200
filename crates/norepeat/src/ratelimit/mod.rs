//! Rate limiting: fixed window, sliding window and GCRA, on any store.
//!
//! De-duplication stops the *same* request twice; a flood of *different*
//! requests (a flash sale where every user submits once, a script trying
//! coupon codes) needs a rate. Each algorithm is one atomic store operation
//! (one Lua script on Redis, timed by Redis `TIME`; one per-key critical
//! section in memory), so every instance sharing a store shares one quota,
//! and every key it writes expires.
//!
//! - [`Quota`]: `N` per period, from `const fn`s over `NonZeroU32` or from
//!   text (`"5/s"`); a zero rate cannot be written. [`Algorithm`] picks
//!   how it is enforced.
//! - [`RateLimiter`]: one named quota on a store, with a
//!   [`FailurePolicy`](crate::degrade::FailurePolicy);
//!   [`check_all`] asks several in turn (per user *and* global).
//! - [`RateLimitLayer`]: the same as a tower layer, with key extractors
//!   ([`ByUser`], [`ByClientIp`], [`ByRoute`], [`Global`], or any closure).
//!   Refusals are 429 `rate_limited` with `Retry-After`, `RateLimit` and
//!   `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers:
//!   `RateLimit-Policy: "user";q=5;w=1`, `RateLimit: "user";r=0;t=1`).
//! - [`arithmetic`](crate::store::rate::arithmetic) (under the store, which runs it): the arithmetic as pure functions of (state, now), with
//!   their bounds.
//!
//! ```
//! use axum::{Router, body::Body, routing::post};
//! use http::Request;
//! use norepeat::ratelimit::{ByUser, Quota, RateLimitLayer, RateLimiter};
//! use norepeat::store::MemoryStore;
//! use tower::ServiceExt;
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let limiter = RateLimiter::new(MemoryStore::default(), Quota::parse("1/m").unwrap()).name("flash");
//! let app: Router = Router::new().route(
//!     "/flash-sale/{sku}",
//!     post(|| async { "ordered" }).layer(RateLimitLayer::new(limiter, ByUser::default())),
//! );
//! let req = || Request::post("/flash-sale/SKU-1").header("x-user-id", "u1").body(Body::empty()).unwrap();
//! assert_eq!(app.clone().oneshot(req()).await.unwrap().status(), 200);
//! let refused = app.oneshot(req()).await.unwrap();
//! assert_eq!(refused.status(), 429);
//! assert_eq!(refused.headers()["ratelimit-policy"], r#""flash";q=1;w=60"#);
//! assert_eq!(refused.headers()["retry-after"], refused.headers()["ratelimit"].to_str().unwrap()
//!     .rsplit("t=").next().unwrap());
//! # }
//! ```
//!
//! # Memory
//! The in-memory store ([`MemoryStore`](crate::store::MemoryStore)) is
//! bounded (its capacity) and forgets a key once its state has expired (a
//! GCRA key when its caller is back to a full allowance, a window's
//! counter with its window), so a limiter keyed by client address cannot
//! be grown without bound by a crowd of callers.
//!
//! # Deployment caveat
//! Limiting by client IP behind proxies reads `X-Forwarded-For`, which any
//! client can write. [`ByClientIp`] only believes the entries appended by
//! the proxies you list; see its docs.

mod key;
mod layer;
mod limiter;
mod quota;
mod verdict;

pub use crate::middleware::ResponseBody;
pub use key::{ByClientIp, ByRoute, ByUser, ExtractKey, Global, MissingKey, PeerAddr};
pub use layer::{RateLimit, RateLimitLayer};
pub use limiter::{RateLimitError, RateLimiter, check_all};
pub use quota::{Algorithm, ParseQuotaError, Quota};
pub use verdict::{Checked, RATELIMIT, RATELIMIT_POLICY, Verdict};
