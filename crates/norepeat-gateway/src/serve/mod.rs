//! Serving the file: the routes as tower stacks of the library's layers
//! over our own forwarding, the gateway's own routes, graceful shutdown.
//!
//! Every request is matched against the routes in order (first match
//! wins); a matched one goes through its route's rate limit, then its
//! guard, then to the upstream; an unmatched one streams through
//! unguarded. The answers are the layers' own, plus 502
//! `upstream_unavailable` and 504 `upstream_timeout` (RFC 9457).
//!
//! ```
//! use norepeat_gateway::{config::Config, serve::Gateway};
//! use tower::ServiceExt;
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Nothing listens on port 9: an unmatched request gets 502.
//! let config = Config::parse("g.yaml", b"upstream: http://127.0.0.1:9\n")?;
//! let app = Gateway::build(&config, None).await?.into_router();
//! let req = http::Request::get("/anything").body(axum::body::Body::empty())?;
//! assert_eq!(app.oneshot(req).await?.status(), 502);
//! # Ok(()) }
//! ```
//!
//! # An unknown outcome on an idempotency route (`ambiguous: keep`)
//! A request that timed out, whose answer broke off half-way (the upstream
//! stage reads an idempotency route's answer body ahead, up to
//! `max_stored_response`, to tell), or that the backend answered 500 or
//! 504, may or may not have had its effect. The upstream stage marks its
//! answer with the library's [`OutcomeUnknown`](norepeat::idempotency::OutcomeUnknown),
//! and the layer records the key's outcome as unknown (one atomic write,
//! kept for `retention`, before the key could be freed): the client gets
//! 504 `upstream_timeout` (or the backend's own answer), and every retry
//! with that key is answered 409 `idempotency_outcome_unknown`, never
//! reaching the backend. `ambiguous: release` leaves the mark off, so the
//! 5xx frees the key; a 502 (nothing reached the backend) always does.

mod answers;
mod cors;
mod files;
mod gateway;
mod head;
mod http1;
mod identify;
mod listen;
mod log;
mod own;
mod page;
mod proxy;
mod reply;
mod route;
mod store;
mod tls;
mod upstream;
mod workers;

pub use gateway::{BuildError, Gateway};
pub use identify::caller::Caller;
pub use identify::scope::HostScoped;
pub use listen::{Workers, arm_stop_signal, serve, serve_workers};
pub use store::SharedStore;
pub use upstream::headers::strip_hop_by_hop;
