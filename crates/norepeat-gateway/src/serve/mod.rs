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
//! The library's layer frees a key when the handler answers a 5xx, so a
//! timed-out request (or one whose answer broke off half-way: the upstream
//! stage reads an idempotency route's answer body ahead, up to
//! `max_stored_response`, to tell) is not answered 504 to the layer: the upstream
//! stage answers it `200` with no body and the header
//! [`OUTCOME_HEADER`]`: unknown`, which the layer stores as the key's
//! record (one atomic write of the layer's own, kept for `retention`, and
//! written before the key could be freed). The gateway answers the client
//! 504 `upstream_timeout`, and every retry with that key meets the
//! stored record and is answered 409 `idempotency_outcome_unknown`,
//! never reaching the backend. `ambiguous: release` answers the layer
//! 504, which frees the key; a 502 (nothing reached the backend) always
//! does.

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
pub use listen::{Workers, serve, serve_workers};
pub use store::SharedStore;
pub use upstream::headers::strip_hop_by_hop;

use axum::body::Body;
use http::{HeaderName, Request, Response};
use std::convert::Infallible;
use tower::util::BoxCloneSyncService;

/// A route's whole stack.
pub(crate) type RouteService = BoxCloneSyncService<Request<Body>, Response<Body>, Infallible>;

/// The header by which the upstream stage tells an idempotency layer's
/// record that the outcome is unknown (see the module docs). Never sent
/// to a client.
pub const OUTCOME_HEADER: HeaderName = HeaderName::from_static("norepeat-gateway-outcome");
