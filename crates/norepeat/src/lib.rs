//! # norepeat
//!
//! Stop duplicate submissions from turning into duplicate effects.
//!
//! A double click, a client framework retrying after a timeout, a broker
//! redelivering, a load balancer resending to another node: a disabled
//! button stops none of these but the first. norepeat gives a back end the
//! pieces to decide for itself:
//!
//! - [`guard`]: stop the repeat at the door, within a window, with one-time
//!   [`token`]s or request [`fingerprint`]s;
//! - [`idempotency`]: let the repeat in and give it the first one's answer
//!   (`Idempotency-Key` with stored-response replay);
//! - [`degrade`]: keep deciding (or refuse, per route) when the store fails;
//! - [`ratelimit`]: cap the flow of different requests;
//! - [`store`]: Redis, Redis Cluster or memory, every change one atomic
//!   operation;
//! - [`keys`], [`identity`], [`problem`]: the shared vocabulary.
//!
//! ```
//! use axum::{Router, routing::post};
//! use norepeat::guard::{FingerprintGuard, NoRepeatLayer};
//! use norepeat::store::MemoryStore;
//!
//! let guard = FingerprintGuard::new(MemoryStore::default());
//! let app: Router = Router::new().route(
//!     "/orders/quick",
//!     post(|| async { "created" }).layer(NoRepeatLayer::fingerprint(guard)),
//! );
//! ```

mod body;
pub mod degrade;
pub mod fingerprint;
pub mod guard;
pub mod idempotency;
pub mod identity;
pub mod keys;
pub mod problem;
pub mod ratelimit;
pub mod store;
pub mod token;
