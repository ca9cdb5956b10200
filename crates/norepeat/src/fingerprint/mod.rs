//! Request fingerprints: how one is computed ([`Fingerprinter`]), the guard
//! that holds it for a window ([`FingerprintGuard`]) and its tower layer
//! ([`FingerprintLayer`]).
//!
//! Who sent what, to which route, canonically: good for APIs and service
//! calls, where a page cannot fetch a token first.
//!
//! A fingerprint is BLAKE3 over, in order and length-prefixed: the user,
//! the method, the concrete request path (`/orders/7/pay`, not the route
//! template `/orders/{id}/pay`: two orders are two requests), the query
//! parameters sorted, and the body.
//! A JSON body is canonicalised first, to its RFC 8785 (JSON Canonicalization
//! Scheme) form with the ignored fields (default `traceId`, `timestamp`,
//! `random`, `sign`; see [`Fingerprinter::ignoring`]) dropped at every depth:
//!
//! - object keys sorted by their UTF-16 code units, at every depth, so
//!   `{"b":1,"a":2}` and `{"a":2,"b":1,"traceId":"x"}` are the same request;
//! - numbers in their ECMAScript form, so `1`, `1.0` and `1e0` are the same
//!   request (a client that re-serialises its retry is not refused as a
//!   different one);
//! - strings with the minimal escapes, so `"\u00e9"` and `"é"` are the same;
//! - an object with a key given twice is refused ([`InvalidJson`](crate::json::InvalidJson)) rather
//!   than read as "the last one wins": the handler's parser might keep the
//!   first, and the fingerprint must not see another request than it does.
//!
//! One deliberate departure from RFC 8785, which reads every number as an
//! IEEE 754 double: an integer a double cannot hold (`9007199254740993`, an
//! id beyond 64 bits, `1e400`) is kept exactly, in the same layout
//! (`12345678901234567890123` is `1.2345678901234567890123e+22`, not its
//! double's `1.2345678901234568e+22`), instead of being rounded into its
//! neighbour's form, so two different integers are never one request.
//! Every integer a double holds, and every number with a fractional part,
//! canonicalises as in RFC 8785 (`0.10000000000000001` is `0.1`, as a
//! `%.17g` serialiser writes it). Any other body is hashed as bytes.
//!
//! ```
//! use norepeat::fingerprint::{Fingerprinter, RequestParts};
//! let fp = Fingerprinter::default();
//! let req = |body: &'static [u8]| RequestParts {
//!     user: "u1", method: "POST", route: "/orders", query: None,
//!     json: true, body,
//! };
//! let a = fp.fingerprint(&req(br#"{"sku":"SKU-1","quantity":1,"traceId":"a"}"#)).unwrap();
//! let b = fp.fingerprint(&req(br#"{"quantity":1,"traceId":"b","sku":"SKU-1"}"#)).unwrap();
//! let c = fp.fingerprint(&req(br#"{"quantity":2,"sku":"SKU-1"}"#)).unwrap();
//! assert_eq!(a, b);
//! assert_ne!(a, c);
//! ```
//!
//! # The guard and the layer
//! [`FingerprintGuard`] decides a fingerprint with one atomic store
//! operation and holds it with a [`Claim`]; [`FingerprintLayer`] puts it in
//! front of any tower service (an axum route, say), answering refusals as
//! RFC 9457 problems ([`crate::problem`]).
//!
//! ```
//! use axum::{Router, routing::post};
//! use norepeat::fingerprint::{FingerprintGuard, FingerprintLayer};
//! use norepeat::store::MemoryStore;
//! use std::time::Duration;
//!
//! let guard = FingerprintGuard::new(MemoryStore::default()).window(Duration::from_secs(3));
//! let app: Router = Router::new().route(
//!     "/orders/quick",
//!     post(|| async { "created" }).layer(FingerprintLayer::new(guard).route("/orders/quick")),
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

mod guard;
mod layer;

pub use crate::fingerprinter::{DEFAULT_IGNORED_FIELDS, Digest, Fingerprinter, RequestParts};
pub use crate::middleware::ResponseBody;
pub use guard::{Claim, FingerprintGuard, FingerprintGuardError, ReleasePolicy};
pub use layer::{Fingerprint, FingerprintLayer};
