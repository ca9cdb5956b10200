//! Business idempotency: `Idempotency-Key` with stored-response replay.
//!
//! The entry guards ([`token`](crate::token), [`fingerprint`](crate::fingerprint)) stop a repeat at the door. This module
//! lets it in and gives it the first one's answer: a payment client that
//! timed out does not know whether it paid, so it sends the same request
//! again with the same key and gets the same answer, without paying twice.
//! It follows Stripe's `Idempotency-Key` and the IETF draft
//! `draft-ietf-httpapi-idempotency-key-header`.
//!
//! # The protocol
//! Every step is one atomic store operation on one key, scoped by caller,
//! method, concrete path and client key (so two users' equal keys never
//! meet, two resources never share a record, and the key lands in one Redis
//! Cluster slot):
//!
//! 1. **Claim**: `put_if_absent(key, in-progress record, lease)`. The record
//!    holds a random owner and the request's fingerprint. When the key is
//!    taken, the same round trip returns what holds it: a running request
//!    (409, or wait) or a completed one (replay), after comparing
//!    fingerprints (422 on a mismatch).
//! 2. **Run** the handler (in the request's future; in a task of its own
//!    once the client leaves), renewing the lease every third of it. The
//!    lease's deadline is inside the in-progress record, and a renewal
//!    rewrites the record with a later one (owner-checked
//!    `replace_if_equals`); the record itself lives for the retention. So
//!    a slow handler keeps its claim, and the claim of a process that died
//!    stays, with a deadline in the past: an **abandoned** claim, whose
//!    outcome is unknown ([`Abandoned`]). Once the handler has started it runs to
//!    its end and its response is stored, whatever the client does (Stripe's
//!    rule): a client that disconnects, or a timeout layer that drops the
//!    request, does not stop it, and the retry gets 409
//!    `idempotency_key_in_use` while it runs, then the replay.
//! 3. **Complete**: `replace_if_equals(key, our exact in-progress bytes,
//!    completed record, retention)`. This is the fence: a request whose
//!    lease expired and whose key another request took cannot overwrite the
//!    new owner's record. Or **release**: `delete_if_equals`, owner-checked,
//!    when the response is not stored, so a retry runs again.
//!    A completion the store refuses (its time budget runs out, the
//!    connection breaks) is tried again with backoff, in a task of its own,
//!    for up to the lease, while the client gets its answer; the key of a
//!    handler that answered is never deleted. If the store stays away that
//!    long, the claim ends with its lease and a retry runs again: the
//!    metric `norepeat_idempotency_completion_lost_total` counts these.
//!
//! Records are compact binary (version, state, owner, fingerprint; then
//! status, allowed headers and the body as is), never JSON with base64.
//!
//! # Answers
//!
//! | situation | answer |
//! |---|---|
//! | first request with a key | the handler runs; its response is stored per the [`StorePolicy`] |
//! | same key, same request, first one done | the stored status, allowed headers and body byte for byte, plus `Idempotent-Replayed: true`; the handler does not run |
//! | same key, other request (body, query, method or caller differ) | 422 `idempotency_key_mismatch` |
//! | same key, first one still running | 409 `idempotency_key_in_use` with `Retry-After: 1`; or, with [`wait_for_result`](IdempotencyLayer::wait_for_result), a bounded wait, then the replay |
//! | same key, first one's outcome unknown (its handler marked it [`OutcomeUnknown`]: a call downstream timed out) | 409 `idempotency_outcome_unknown`, for the retention, never run again; with a [`reconcile`](IdempotencyLayer::reconcile) hook, the application is asked (see [`Reconcile`]) |
//! | same key, first one abandoned (its lease passed unrenewed with no answer stored: its process was killed, or lost the store for a whole lease) | 409 `idempotency_outcome_unknown`, for the retention, never run again (default, [`Abandoned::OutcomeUnknown`]); with [`Abandoned::Retry`], one repeat takes the claim over and runs as [`Attempt`] 2 |
//! | the same, where the effect commits with the record ([`IdempotentTx`]) | the abandoned claim's transaction never committed: it ran no effect, so [`Abandoned::Retry`] is right there and the repeat runs (the shop's `POST /payments` does this) |
//! | a record written by the release before this one (version 3, no deadline), in progress | 409 `idempotency_key_in_use` for as long as it lives (its lease), as before |
//! | body declared JSON (by its `Content-Type`) that does not parse | 400 `invalid_request`, before any claim: nothing is stored, the handler does not run, and the key stays free for the corrected request |
//! | no key, where required | 400 `missing_idempotency_key` |
//! | key empty, over 255 characters, repeated, or not visible ASCII | 400 `invalid_idempotency_key` |
//! | no caller identity | 401 `unauthenticated` |
//! | request body over 64 KiB | 413 `payload_too_large` |
//! | store down (default fail-closed) | 503 `guard_unavailable` with `Retry-After`; a claim that may have landed all the same (a timeout, a lost connection, a write its replicas did not acknowledge: [`StoreError::may_have_landed`](crate::store::StoreError::may_have_landed)) is taken back, owner-checked, so the retry runs (`norepeat_claims_taken_back_total`) |
//! | 5xx or handler error (default policy) | passed on; key released, a retry runs again |
//! | 401, 403, 404, 408, 409, 413 or 429 (default policy) | passed on, not stored; key released: nothing happened and the answer describes the caller or a moment, and a client sending fresh keys piles up no records |
//! | stored status (2xx by default) whose body cannot be kept: over the cap (1 MiB), `text/event-stream`, trailers, or a body that breaks half-way | passed on whole; the outcome is stored without its body, and a retry gets the first status, an empty body, `Idempotent-Replayed: true` and `Idempotent-Body: omitted` (the handler does not run again) |
//! | storing the response fails (the store's budget runs out, the connection breaks) | the client gets its answer; the completion is tried again with backoff for up to the lease, the key never deleted; a retry gets 409, then the replay |
//! | the store stays away for the whole lease (a lost completion) | the claim stays, its lease passed: a retry gets 409 `idempotency_outcome_unknown` (the handler had its effect; it never runs again); counted in `norepeat_idempotency_completion_lost_total` |
//! | [`max_detached`](IdempotencyLayer::max_detached) handlers (1024) already running | 503 `guard_unavailable` with `Retry-After: 1`, before the claim: the key stays free, the handler does not run |
//!
//! Invalid JSON gets the same answer from both layers: the fingerprint
//! [`FingerprintLayer`](crate::fingerprint::FingerprintLayer) also answers 400
//! `invalid_request`. A request that says it is JSON and is not cannot be
//! compared with its repeats by content, and it is the client's mistake,
//! not a result worth replaying for a day: the client learns at once and
//! retries, corrected, with the same key. A body that only looks like JSON
//! (no JSON content type) and does not parse is compared by its bytes.
//!
//! A truncated body is never stored: a body is read up to the cap, and the
//! moment it passes the cap, what was read is sent on followed by the rest.
//! A body is stored only if the handler's body ended cleanly; otherwise
//! the outcome is stored without it (the handler answered: its effect
//! happened, and a free key would run it again). Only a status the
//! [`StorePolicy`] does not store frees the key. The record of an omitted
//! body is an ordinary completed record carrying the header
//! `Idempotent-Body: omitted`, so an instance of the release before this
//! one, in a rolling deploy, replays it alike.
//!
//! # Compared with Stripe and the IETF draft
//!
//! | | norepeat | Stripe (API v1) | IETF draft |
//! |---|---|---|---|
//! | key | 1 to 255 visible ASCII; the draft's quoted form `"..."` accepted | up to 255 characters, V4 UUID suggested | a structured-field string; UUID suggested |
//! | missing key | 400 `missing_idempotency_key` (or pass through, `required(false)`) | optional: the request just runs | 400 for an operation documented to need it |
//! | same key, other request | 422 `idempotency_key_mismatch` | an `idempotency_error` (compares incoming parameters) | 422 |
//! | same key, still running | 409 with `Retry-After`, or a bounded wait and the replay | 409 conflict, nothing saved | 409 |
//! | what is replayed | status, allow-listed headers, body byte for byte, `Idempotent-Replayed: true` | status code and body | the stored response |
//! | which responses are stored | configurable: 2xx, 3xx and request-describing 4xx, not 401, 403, 404, 408, 409, 413 or 429 (default); all; or 2xx only | everything once the endpoint began, 500s included ([`StorePolicy::All`]) | left to the server |
//! | retention | 24 h default, configurable | keys may be pruned after at least 24 h | expiry policy is the server's, and should be published |
//! | scope | caller + method + concrete path + key | account + key | the resource |
//! | lost claim (slow or dead owner) | lease with renewal; a dead owner's claim is an unknown outcome (409), or taken over as attempt 2 with [`Abandoned::Retry`] (the handler is told its [`Attempt`]); a stale completion is fenced out | not documented | not specified |
//! | client gone mid-request | the handler runs to its end, its response is stored | the request finishes on the server | not specified |
//!
//! # Example
//! ```
//! use axum::{Router, routing::post};
//! use norepeat::idempotency::{IdempotencyLayer, StorePolicy};
//! use norepeat::store::MemoryStore;
//! use std::time::Duration;
//!
//! let layer = IdempotencyLayer::new(MemoryStore::default())
//!     .store_policy(StorePolicy::Default)
//!     .wait_for_result(Duration::from_secs(2))
//!     .route("/payments");
//! let app: Router = Router::new().route("/payments", post(|| async { "paid" }).layer(layer));
//! ```
//!
//! # Records in the database, committed with the effect
//! On a SQL store (`store::SqlStore`, features `postgres`,
//! `sqlite`) the records are rows of the application's own database, and a
//! handler can commit its writes and the completed record in one
//! transaction with [`IdempotentTx`]: a crash then leaves either no effect
//! (the claim expires and a retry runs once) or the effect with its record,
//! never the effect with the key free. See "Transactional completion" in
//! the docs of `store::sql`.
//!
//! # Shutdown
//! A handler whose client left runs on in a task of its own, which a
//! server's graceful shutdown does not wait for. The layer tracks these
//! tasks in a [`DetachedTasks`]: after the server stopped accepting and its
//! requests ended, close it and wait for it (with a time limit), so no
//! handler is killed between its effect and its record. See
//! [`DetachedTasks`] for an example.
//!
//! # Deployment caveat
//! Idempotency is as durable as its store. With Redis, a failover that
//! loses the last writes can forget a completed record, and a retry then
//! runs again: keep the database's unique business keys as the backstop,
//! or keep the records in the database (above).
//! The route fails closed by default for the same reason: without its
//! store it cannot know whether a request already ran.

mod body;
mod detached;
mod guard;
mod layer;
mod policy;
mod reconcile;
mod record;
mod tx;

pub use body::Passthrough;
pub use detached::DetachedTasks;
pub(crate) use guard::CLOCK_SKEW_MS;
pub use guard::{Abandoned, IdempotencyError};
pub use layer::{
    Attempt, DEFAULT_MAX_DETACHED, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, Idempotency,
    IdempotencyLayer, Inspected, OutcomeUnknown, RecordState, Replayed, ResponseBody,
};
pub use policy::{DEFAULT_REPLAYED_HEADERS, StorePolicy, StoredHeaders};
pub use reconcile::{IDEMPOTENCY_RECONCILED, Reconcile, ReconcileFuture, Reconciled};
pub use record::IDEMPOTENT_BODY;
pub use tx::{IdempotentTx, TxError};
