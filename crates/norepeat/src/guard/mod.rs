//! The entry guard: stop a repeat at the door, within a window.
//!
//! Two ways to tell a repeat, usable from code or as a tower layer:
//!
//! - **Tokens** ([`TokenGuard`]): the page fetches a one-time token and the
//!   submit consumes it. Good for pages and forms.
//! - **Fingerprints** ([`FingerprintGuard`]): user, method, concrete path,
//!   query and canonical body, held for a window (default 3 s) counted from
//!   the first request. Good for APIs and service calls.
//!
//! Each decision is one atomic store operation. [`NoRepeatLayer`] wraps any
//! tower service (an axum route, say); rejections are RFC 9457 responses
//! ([`crate::problem`]), never errors.
//!
//! ```
//! use axum::{Router, routing::post};
//! use norepeat::guard::{FingerprintGuard, NoRepeatLayer};
//! use norepeat::store::MemoryStore;
//! use std::time::Duration;
//!
//! let guard = FingerprintGuard::new(MemoryStore::default()).window(Duration::from_secs(3));
//! let app: Router = Router::new().route(
//!     "/orders/quick",
//!     post(|| async { "created" }).layer(NoRepeatLayer::fingerprint(guard).route("/orders/quick")),
//! );
//! ```
//!
//! # Choosing the window
//! Longer than the handler's p99 (2 to 3 times, plus a margin) so a
//! framework's retry after a timeout is still caught; short enough not to
//! block an honest second order. A handler that runs past the window keeps
//! its key by renewal (see [`FingerprintGuard::renew_up_to`]).
//!
//! # A request that is dropped
//! hyper drops a handler's future when its client disconnects, and so does
//! a timeout layer. The handler may already have had its effect, so a
//! dropped request counts as done: its key is held for the rest of the
//! window and a retry within it gets 409. Renewal stops with the dropped
//! future, so the key never outlives its window. An error, a 4xx or 5xx, or
//! a panic still releases at once under [`ReleasePolicy::HoldOnSuccess`].

mod fingerprint;
mod layer;
mod service;
mod token;

pub(crate) use fingerprint::store_failure;
pub use fingerprint::{FingerprintGuard, Lease, ReleasePolicy};
pub use layer::NoRepeatLayer;
pub use service::{NoRepeat, ResponseBody};
pub use token::TokenGuard;
