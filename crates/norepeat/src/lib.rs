// Over 400 lines on purpose: the crate's front page: its docs (runnable examples of each guard) and the public modules.
//! # norepeat
//!
//! Stop duplicate submissions from turning into duplicate effects.
//!
//! A double click, a client framework retrying after a timeout, a broker
//! redelivering, a load balancer resending to another node: a disabled
//! button stops none of these but the first. norepeat gives a back end the
//! pieces to decide for itself:
//!
//! - [`token`] and [`fingerprint`]: stop the repeat at the door, within a
//!   window, with one-time tokens (the page fetches one, the submit consumes
//!   it) or request fingerprints (caller, method, path and canonical body);
//!   each is a guard you can call and a tower layer;
//! - [`idempotency`]: let the repeat in and give it the first one's answer
//!   (`Idempotency-Key` with stored-response replay);
//! - [`degrade`]: keep deciding (or refuse, per route) when the store fails;
//! - [`ratelimit`]: cap the flow of different requests;
//! - [`store`]: Redis, Redis Cluster, memory, or a table in your PostgreSQL
//!   or SQLite database, every change one atomic operation;
//! - [`webhook`]: verify a signed webhook (HMAC-SHA256 over timestamp and
//!   raw body, constant-time, with a replay window);
//! - [`keys`], [`identity`], [`request`], [`problem`], [`body`], [`json`],
//!   [`clock`]: the shared vocabulary (store keys, who is calling, the path
//!   the client sent, RFC 9457 answers, reading a body and the one rule for
//!   JSON bodies, the one strict JSON reader, the wall clock);
//! - [`guard`] and [`attribute`]: `#[norepeat::guard(...)]` on any
//!   `async fn`, refusing repeats within a window or running once per key
//!   with the stored result given back to repeats.
//!
//! # Layout
//! Each capability is a module with the same files in the same roles: a
//! core that decides (`fingerprint/guard.rs`, `token/guard.rs`,
//! `idempotency/guard.rs`, `ratelimit/limiter.rs`, `webhook/mod.rs`: a
//! guard, limiter or verifier you can call, returning its own error enum
//! that says what it refused and why), and `layer.rs`, its tower layer,
//! which turns that error into an HTTP answer at the edge (the
//! `From<...> for Problem` sits there, beside the layer). HTTP points one
//! way: [`problem`] knows no capability, and no core imports it (a test
//! reads the sources to keep it so). The five services share one private
//! skeleton (`middleware.rs`: `poll_ready`, the clone of the inner
//! service, the boxed future, `get_ref`/`get_mut`/`into_inner`), so a
//! layer writes only what it does with a request. Modules import only what
//! sits below them, never beside: the layers use the guards, and the guards
//! use one claim life cycle (a private `claim` module), the request
//! fingerprinter (private, re-exported as [`fingerprint::Fingerprinter`]),
//! [`json`], [`keys`] and the [`store`].
//!
//! # Vocabulary
//! - **claim**: holding a store key while work runs (claim, run with
//!   renewal, then complete, release or keep). Every guard holds its key
//!   through one claim type; the fingerprint guard hands out a
//!   [`fingerprint::Claim`]. An attempt's outcome is a `Claimed`: `Owned`
//!   (this caller holds the key), `Held` (another does), `Done` (an earlier
//!   call's stored result), `Refused`, or `Unguarded` (the store failed and
//!   the policy fails open).
//! - **lease**: a claim's time to live without renewal (the attribute's
//!   `lease = "30s"`, [`IdempotencyLayer::lease`](idempotency::IdempotencyLayer::lease)):
//!   a duration, never a type.
//! - **window** and **retention**: how long a fingerprint is held, and how
//!   long a stored result is kept.
//! - **wait**: how long a repeat waits for a running call's result, always a
//!   [`Duration`](std::time::Duration); `Duration::ZERO` (the default) is
//!   no wait.
//! - **mode**: the attribute's `window` or `once`
//!   ([`attribute::GuardMode`]); in metrics and traces, the `mode` label
//!   names what decided (`fingerprint`, `token`, `once`, `idempotency`,
//!   `ratelimit`).
//! - **namespace**: what a store key is for, one letter in the key
//!   ([`keys::Namespace`]).
//! - **X / XLayer**: a tower layer `XLayer` builds the service `X`
//!   ([`FingerprintLayer`](fingerprint::FingerprintLayer) builds
//!   [`Fingerprint`](fingerprint::Fingerprint)); the layer holds the
//!   settings its service reads.
//!
//! ```
//! use axum::{Router, routing::post};
//! use norepeat::attribute::Rejected;
//! use norepeat::fingerprint::{FingerprintGuard, FingerprintLayer};
//! use norepeat::store::MemoryStore;
//!
//! #[derive(Debug)]
//! enum Error { Refused(Rejected) }
//! impl From<Rejected> for Error {
//!     fn from(r: Rejected) -> Self { Error::Refused(r) }
//! }
//!
//! // A free function, guarded: it runs once per order; a repeat (a
//! // redelivered message) gets the first result back, and one arriving while
//! // the first still runs waits up to 2 s for it. No `store = ...`: it uses
//! // the process-wide store set below.
//! #[norepeat::guard(key = "{order_id}", mode = once, wait = "2s")]
//! async fn award_points(order_id: u64, points: i64) -> Result<i64, Error> {
//!     Ok(points)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MemoryStore::default(); // or RedisStore::connect("redis://...").await?
//! norepeat::attribute::set_default_store(store.clone())?;
//! assert_eq!(award_points(7, 30).await.unwrap(), 30);
//! assert_eq!(award_points(7, 99).await.unwrap(), 30); // the stored result
//!
//! // An HTTP route, guarded by a tower layer on the same store.
//! let guard = FingerprintGuard::new(store);
//! let app: Router = Router::new().route(
//!     "/orders/quick",
//!     post(|| async { "created" }).layer(FingerprintLayer::new(guard)),
//! );
//! # Ok(()) }
//! ```
//!
//! # Add it
//! ```toml
//! [dependencies]
//! norepeat = "0.1"
//! axum = "0.8"                       # for the tower layers in an axum app
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! ```
//!
//! # Features
//!
//! | feature | default | what it adds | pulls in |
//! |---|---|---|---|
//! | `redis` | **on** | [`store::RedisStore`] (one Redis) and [`store::ClusterStore`] (Redis Cluster), and their `redis://` and `redis+cluster://` URLs in [`store::AnyStore::from_url`] | `redis` |
//! | `postgres` | off | `store::PgStore` (`SqlStore<Postgres>`): records as rows of your PostgreSQL database, completed in your transaction ([`idempotency::IdempotentTx`], the attribute's `tx = ...`) | `sqlx` 0.9 with `postgres` |
//! | `sqlite` | off | `store::SqliteStore` (`SqlStore<Sqlite>`), the same on SQLite | `sqlx` 0.9 with `sqlite` (SQLite bundled) |
//!
//! This table lists every feature of this version; each pulls only its own
//! backend (`postgres` builds no SQLite). Every other part of the crate
//! (the memory store, the guards, the layers, the attribute) is always
//! there. `redis` is on by default because a guard is meant to be shared by
//! every instance of a service, and Redis is the store that does that:
//! `norepeat = "0.1"` is enough. For one process, or for tests, with the
//! in-memory store only: `norepeat = { version = "0.1", default-features =
//! false }`. The SQL stores take an `sqlx::Pool` of your own: pair them
//! with `sqlx = "0.9"` (the version this release is built on; another
//! major version's pool is another type).
//!
//! The stores: [`store::MemoryStore`] (always), `RedisStore` and
//! `ClusterStore` (`redis`), `PgStore` (`postgres`), `SqliteStore`
//! (`sqlite`), and [`store::AnyStore`] to pick one from a URL at start-up.
//!
//! Minimum Rust: 1.94, what sqlx 0.9 needs (without the SQL features, the
//! dependencies need 1.88). A test (`tests/it/packaging.rs`) checks it
//! against every dependency's declared `rust-version`.

#![cfg_attr(docsrs, feature(doc_cfg))]
pub mod attribute;
pub mod body;
mod claim;
pub mod clock;
pub mod degrade;
pub mod fingerprint;
mod fingerprinter;
pub mod idempotency;
pub mod identity;
pub mod json;
pub mod keys;
mod middleware;
pub mod problem;
pub mod ratelimit;
pub mod request;
pub mod shadow;
pub mod store;
pub mod token;
pub mod webhook;

#[cfg(test)]
mod edge_tests;

/// Guards an `async fn` against repeats: one line, and every call is guarded.
///
/// ```text
/// #[norepeat::guard(
///     key = "TEMPLATE",                    // required: "{arg}", "{arg.field.0}", literal text, "{{" "}}"
///     store = EXPR,                        // a value or place whose type is Store + Clone;
///                                          // default: the process-wide store (attribute::set_default_store)
///     mode = window | once,                // default window
///     window = "3s",                       // window mode: how long a key is held (default 3 s)
///     retention = "24h",                   // once mode: how long the stored result is kept (default 24 h)
///     lease = "30s",                       // once mode: life of an unrenewed claim (default 30 s)
///     wait = "2s",                         // once mode: how long a repeat waits for a running call (default 0)
///     scope = "billing::charge",           // default: the fn's module path and name
///     on_store_failure = fail_open | fail_closed, // default fail_open
///     abandoned = unknown | retry,         // once mode: a claim whose call died (default unknown;
///                                          // retry with `tx`)
///     tx = tx,                             // once mode on a SQL store: the body's writes and its
///                                          // stored result commit in one transaction named `tx`
/// )]
/// ```
///
/// Durations are a whole number and `ms`, `s`, `m`, `h` or `d`. The key
/// template names the function's arguments (`self` included) and their
/// fields; each `{...}` is formatted with `Display` (`{arg:?}` for `Debug`).
/// Each literal segment and each formatted argument is length-prefixed
/// ([`keys::KeyParts`]), and the store key hashes the scope with the
/// result, so any characters are safe: with `"{user}/{id}"`, user `a/b`
/// with id `c` and user `a` with id `b/c` get different keys.
///
/// # The store
/// `store = EXPR` is evaluated on each call, then cloned (`(EXPR).clone()`,
/// so both `self.store` and a `&Store` argument work). Without it, the
/// function uses the process-wide store: set it once at start with
/// [`attribute::set_default_store`] (any [`store::Store`], such as a
/// `RedisStore` or a [`Resilient`](store::Resilient) around one), and
/// every guarded function that names no store shares it. A call made before
/// it is set returns `Err(E::from(`[`Rejected::NoDefaultStore`](attribute::Rejected::NoDefaultStore)`))`
/// without running the body (never a panic, never an unguarded run).
///
/// The function must return `Result<T, E>` with `E: From<`[`attribute::Rejected`]`>`:
/// a refused call returns `Err(E::from(rejected))` without running the body.
///
/// - **`mode = window`** (the default): the first call with a key holds it
///   for the window; a repeat within the window gets
///   [`Rejected::Duplicate`](attribute::Rejected::Duplicate). After a success the
///   key is held for the rest of the window; after an `Err` or a panic it is
///   released at once, so a retry runs. A dropped future (a caller that gave
///   up mid-body) counts as done: the key is held for the rest of the window.
/// - **`mode = once`**: the body runs at most once per key with success; its
///   `Ok` value (`T: Serialize + DeserializeOwned`, JSON in the store) is
///   kept for `retention` and every later call gets it back without running
///   the body. A call while the first still runs gets
///   [`Rejected::InProgress`](attribute::Rejected::InProgress), or with
///   `wait = "2s"` waits up to that long (looking again with backoff) and
///   gets the first call's result when it is stored, without running the
///   body; after the wait, `InProgress`. After an `Err` or
///   a panic the claim is released: a failure is never remembered, so the
///   next call (a redelivered message) runs again. A dropped future never
///   frees the claim early (the body may have had its effect already):
///   calls get `InProgress` while its `lease` lasts, and then, the claim
///   abandoned (its deadline passed with no result), [`Rejected::OutcomeUnknown`](attribute::Rejected::OutcomeUnknown)
///   until the retention ends: the body is not run again. `abandoned =
///   retry` lets a later call take the claim over and run the body again
///   (the default with `tx`, whose effect commits with the result). See
///   [`attribute`] for the detached variant that finishes the body and
///   stores its result whatever the caller does.
/// - **`on_store_failure`**: `fail_open` runs the body unguarded (keep a
///   unique key behind it); `fail_closed` refuses with
///   [`Rejected::Unavailable`](attribute::Rejected::Unavailable).
///
/// See [`attribute`] for the runtime it expands to (usable without the macro).
///
/// # Calls from the same type are guarded too
/// Spring's `@NoRepeatSubmit` is an aspect on a proxy: a call from another
/// method of the same class skips the proxy, and the guard silently does
/// nothing. This attribute rewrites the function's own body, so there is no
/// way around it: `checkout` below calls `place` on `self`, and the second
/// checkout with the same order is still refused.
///
/// ```
/// use norepeat::attribute::Rejected;
/// use norepeat::store::MemoryStore;
/// use std::sync::atomic::{AtomicU32, Ordering};
///
/// #[derive(Debug, PartialEq)]
/// enum ShopError { Refused(Rejected) }
/// impl From<Rejected> for ShopError {
///     fn from(r: Rejected) -> Self { ShopError::Refused(r) }
/// }
///
/// struct Order { user_id: String, biz_id: String }
///
/// struct Shop { store: MemoryStore, placed: AtomicU32 }
///
/// impl Shop {
///     #[norepeat::guard(store = self.store, key = "{order.user_id}:{order.biz_id}", window = "3s")]
///     async fn place(&self, order: &Order) -> Result<u32, ShopError> {
///         Ok(self.placed.fetch_add(1, Ordering::SeqCst) + 1)
///     }
///
///     /// Not guarded itself: calls the guarded method on `self`.
///     async fn checkout(&self, order: &Order) -> Result<u32, ShopError> {
///         self.place(order).await
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let shop = Shop { store: MemoryStore::default(), placed: AtomicU32::new(0) };
/// let order = Order { user_id: "u1".into(), biz_id: "cart-7".into() };
/// assert_eq!(shop.checkout(&order).await, Ok(1));
/// assert!(matches!(
///     shop.checkout(&order).await,
///     Err(ShopError::Refused(Rejected::Duplicate { .. }))
/// ));
/// assert_eq!(shop.placed.load(Ordering::SeqCst), 1);
/// # }
/// ```
///
/// # Once per key, with the stored result
/// ```
/// use norepeat::attribute::Rejected;
/// use norepeat::store::MemoryStore;
///
/// #[derive(Debug)]
/// struct Failed;
/// impl From<Rejected> for Failed {
///     fn from(_: Rejected) -> Self { Failed }
/// }
///
/// #[norepeat::guard(store = store, key = "order:{order_id}", mode = once, retention = "7d", wait = "2s")]
/// async fn award_points(store: &MemoryStore, order_id: &str, points: i64) -> Result<i64, Failed> {
///     Ok(points) // the effect, once per order
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store = MemoryStore::default();
/// assert_eq!(award_points(&store, "o-1", 30).await.unwrap(), 30);
/// // A redelivery does not run the body again: it gets the first answer.
/// assert_eq!(award_points(&store, "o-1", 99).await.unwrap(), 30);
/// # }
/// ```
///
/// # Once per key, in one database transaction
/// With `tx = NAME` (`mode = once`, and `store = ...` naming a
/// `PgStore` or `SqliteStore`,
/// features `postgres` / `sqlite`), the body gets a transaction opened on
/// the store's pool, as a binding `NAME` of type
/// `sqlx::Transaction<'static, DB>`; the function takes no such argument.
/// On `Ok`, the stored result is written in that transaction (checked to be
/// this call's claim still) and one `COMMIT` makes the body's writes and the
/// record durable together: a redelivered message finds the record and
/// writes nothing. On `Err` the transaction rolls back and the key is free.
/// A crash or a dropped future before the commit leaves no writes and the
/// claim open until its `lease` ends (meanwhile a repeat gets
/// [`Rejected::InProgress`](attribute::Rejected::InProgress)); then the next
/// delivery runs once. This is
/// `Guarded::run_once_in_tx` (see [`attribute`]).
///
/// The body writes through `&mut *NAME` and must neither commit it nor move
/// it. It runs in a `move` closure, so it owns the arguments it uses (the
/// key is built before). `wait` does not go with `tx`: a repeat gets the
/// stored result or `InProgress` at once.
///
#[cfg_attr(feature = "sqlite", doc = "```")]
#[cfg_attr(not(feature = "sqlite"), doc = "```ignore")]
/// use norepeat::attribute::Rejected;
/// use norepeat::store::SqliteStore;
///
/// #[derive(Debug)]
/// enum Error { Refused(Rejected), Db(sqlx::Error) }
/// impl From<Rejected> for Error {
///     fn from(r: Rejected) -> Self { Error::Refused(r) }
/// }
/// impl From<sqlx::Error> for Error {
///     fn from(e: sqlx::Error) -> Self { Error::Db(e) }
/// }
///
/// struct Msg { id: String, user: String, points: i64 }
///
/// struct Consumer { store: SqliteStore }
///
/// impl Consumer {
///     /// Awards the points and records the message, in one transaction.
///     #[norepeat::guard(store = self.store, key = "{msg.id}", mode = once, tx = tx)]
///     async fn award(&self, msg: &Msg) -> Result<i64, Error> {
///         sqlx::query("INSERT INTO points (user_id, n) VALUES (?, ?)")
///             .bind(&msg.user)
///             .bind(msg.points)
///             .execute(&mut *tx)
///             .await?;
///         Ok(msg.points)
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::sqlite::SqlitePoolOptions::new()
///     .max_connections(1)
///     .connect("sqlite::memory:")
///     .await?;
/// sqlx::query("CREATE TABLE points (user_id TEXT, n INTEGER)").execute(&pool).await?;
/// let store = SqliteStore::new(pool.clone());
/// store.migrate().await?;
/// let consumer = Consumer { store };
/// let msg = Msg { id: "m-7".into(), user: "u1".into(), points: 30 };
/// for _delivery in 0..3 {
///     assert_eq!(consumer.award(&msg).await.unwrap(), 30);
/// }
/// let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM points").fetch_one(&pool).await?;
/// assert_eq!(rows, 1);
/// # Ok(()) }
/// ```
///
/// # Compile errors
/// Wrong arguments are refused at compile time with a message on the
/// offending token: an unknown option, a missing `key`, a key
/// naming something that is not an argument, an invalid duration, an option
/// of the other mode (`tx` included), `tx` without `store`, or a function
/// that is not `async`. `tx` with a store that is not SQL fails on the
/// bound of `run_once_in_tx`.
///
/// ```compile_fail
/// # use norepeat::store::MemoryStore;
/// # struct E; impl From<norepeat::attribute::Rejected> for E { fn from(_: norepeat::attribute::Rejected) -> Self { E } }
/// #[norepeat::guard(store = store, key = "{id}", window = "3 parsecs")]
/// async fn f(store: &MemoryStore, id: u64) -> Result<(), E> { Ok(()) }
/// ```
pub use norepeat_macros::guard;

/// The crate README's example, compiled with the doc tests so it cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
