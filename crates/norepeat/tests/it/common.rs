//! Helpers the test modules share, for the library's own tests. What
//! other crates' tests use too is the test kit's (`norepeat-testkit`): the
//! HTTP helper (`send`, `Answer`), the metrics recorder (`Recorded`), the SQL
//! backends (`SqlBackend`).

use axum::Router;
use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::{Route, post};
use http::{Request, StatusCode};
use norepeat::attribute::Rejected;
use norepeat::store::{AnyStore, MemoryStore};
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tower::{Layer, Service};

/// What the tests' guarded functions return: a refusal from the guard
/// (`?` turns a `Rejected` into it, as the attribute asks) or their own
/// failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    Refused(Rejected),
    Failed,
}

impl From<Rejected> for Error {
    fn from(r: Rejected) -> Self {
        Error::Refused(r)
    }
}

/// How long a test waits for something that must happen: generous, so a
/// busy two-core machine cannot break it, and a passing run waits only as
/// long as the thing takes.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Polls `attempt` every 10 ms until it gives `Some`, for up to
/// [`PATIENCE`]; past that the test fails, naming `what` it waited for.
pub async fn eventually<T, F, Fut>(what: &str, attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_within(PATIENCE, what, attempt).await
}

/// [`eventually`] with a deadline of its own: for a test whose thing
/// would also happen by itself later (a key's TTL), so the wait must end
/// well before that.
pub async fn eventually_within<T, F, Fut>(within: Duration, what: &str, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(t) = attempt().await {
            return t;
        }
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A route at `path` behind `layer` whose handler counts its runs in
/// `runs`, panics on its first run (while `panic_next` is set), then
/// answers 201.
pub fn panicking_route<L: RouteLayer>(
    path: &str,
    layer: L,
    runs: Arc<AtomicUsize>,
    panic_next: Arc<std::sync::atomic::AtomicBool>,
) -> Router {
    Router::new().route(
        path,
        post(move || {
            let runs = Arc::clone(&runs);
            let panic_next = Arc::clone(&panic_next);
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                assert!(!panic_next.swap(false, Ordering::SeqCst), "injected panic");
                (StatusCode::CREATED, "created")
            }
        })
        .layer(layer),
    )
}

/// Sends `req` to `app` in a task of its own, as a server does, and
/// checks the handler's panic came out of it (the task ended with a
/// panic, not an answer).
pub async fn send_and_panic(app: &Router, req: Request<Body>) {
    use tower::ServiceExt;
    let app = app.clone();
    let out = tokio::spawn(async move { app.oneshot(req).await }).await;
    match out {
        Err(e) => assert!(e.is_panic(), "the task ended without a panic: {e}"),
        Ok(res) => panic!(
            "the handler answered {} instead of panicking",
            res.unwrap().status()
        ),
    }
}

/// Drives `call` until `reached()` holds, then drops it, as hyper drops a
/// handler's future when its client goes away: a caller that gives up at
/// that point, however slow the machine. The test fails if `call` ends
/// first or `reached` does not hold within [`PATIENCE`].
pub async fn drop_when<F: Future>(call: F, what: &str, reached: impl Fn() -> bool) {
    tokio::select! {
        biased;
        () = eventually(what, || {
            let now = reached();
            async move { now.then_some(()) }
        }) => {}
        _ = call => panic!("the call ended before {what}: it cannot be dropped there"),
    }
}

/// Runs `test` against a fresh memory store, then (with the `redis`
/// feature) a fresh Redis, whose keys must all carry a TTL afterwards: a
/// guard never leaves a key behind for good.
pub async fn with_stores<F, Fut>(test: F)
where
    F: Fn(AnyStore) -> Fut,
    Fut: Future<Output = ()>,
{
    test(AnyStore::Memory(MemoryStore::default())).await;
    #[cfg(feature = "redis")]
    {
        let redis = norepeat_testkit::RedisServer::start().await;
        let store = norepeat::store::RedisStore::connect(&redis.url())
            .await
            .unwrap_or_else(|e| panic!("connect {}: {e}", redis.url()));
        test(AnyStore::Redis(store)).await;
        assert_eq!(redis.keys_without_ttl().await, Vec::<String>::new());
    }
}

/// Stamps one suite per store (tower-sessions runs its suite per store
/// with a macro too): for each case, an `async fn case(store)`, a module of
/// that name with a `memory` test and, with the `redis` feature, a `redis`
/// test, after which every Redis key must carry a TTL.
///
/// `each_store!(a, b)` runs them on `#[tokio::test]`; a test attribute in
/// front picks another runtime: `each_store!(#[tokio::test(flavor =
/// "multi_thread", worker_threads = 2)] a, b)`. `; then check` runs `async fn
/// check(&RedisServer)` after each Redis run. The internal `@case` arm takes
/// further tests for the module (a file's own backends, such as SQL).
macro_rules! each_store {
    (@case #[$test:meta] $case:ident [$($check:ident)?] { $($more:tt)* }) => {
        mod $case {
            #[$test]
            async fn memory() {
                super::$case(norepeat::store::MemoryStore::default()).await;
            }

            #[cfg(feature = "redis")]
            #[$test]
            async fn redis() {
                let redis = norepeat_testkit::RedisServer::start().await;
                let store = norepeat::store::RedisStore::connect(&redis.url())
                    .await
                    .unwrap_or_else(|e| panic!("connect {}: {e}", redis.url()));
                super::$case(store).await;
                assert_eq!(redis.keys_without_ttl().await, Vec::<String>::new());
                $(super::$check(&redis).await;)?
            }

            $($more)*
        }
    };
    (#[$test:meta] $($case:ident),+ $(,)?) => {
        $(each_store!(@case #[$test] $case [] {});)+
    };
    (#[$test:meta] $($case:ident),+ ; then $check:ident) => {
        $(each_store!(@case #[$test] $case [$check] {});)+
    };
    ($($case:ident),+ $(,)?) => {
        each_store!(#[tokio::test] $($case),+);
    };
    ($($case:ident),+ ; then $check:ident) => {
        each_store!(#[tokio::test] $($case),+ ; then $check);
    };
}
pub(crate) use each_store;

/// `POST /orders` behind `layer`: its handler counts its runs and answers
/// 201. (Generic over the layer: the token and the fingerprint layer are
/// two types.)
pub fn counting_route<L: RouteLayer>(layer: L, runs: Arc<AtomicUsize>) -> Router {
    Router::new().route(
        "/orders",
        post(move || {
            let runs = Arc::clone(&runs);
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                // Long enough for the concurrent copies to overlap.
                tokio::time::sleep(Duration::from_millis(20)).await;
                (StatusCode::CREATED, "created")
            }
        })
        .layer(layer),
    )
}

/// What `MethodRouter::layer` asks of a layer, named once: a test's route
/// builder that takes any of the library's layers (their types differ)
/// says `L: RouteLayer` instead of repeating the bounds.
pub trait RouteLayer:
    Layer<Route, Service = <Self as RouteLayer>::Service> + Clone + Send + Sync + 'static
{
    /// The layer's service.
    type Service: Service<
            Request<Body>,
            Error = Infallible,
            Response = <Self as RouteLayer>::Response,
            Future = <Self as RouteLayer>::Future,
        > + Clone
        + Send
        + Sync
        + 'static;
    /// The service's response.
    type Response: IntoResponse + 'static;
    /// The service's future.
    type Future: Send + 'static;
}

impl<L> RouteLayer for L
where
    L: Layer<Route> + Clone + Send + Sync + 'static,
    L::Service: Service<Request<Body>, Error = Infallible> + Clone + Send + Sync + 'static,
    <L::Service as Service<Request<Body>>>::Response: IntoResponse + 'static,
    <L::Service as Service<Request<Body>>>::Future: Send + 'static,
{
    type Service = L::Service;
    type Response = <L::Service as Service<Request<Body>>>::Response;
    type Future = <L::Service as Service<Request<Body>>>::Future;
}

/// A plain connection to one node of a test cluster (or any Redis) on
/// `port`, for reading what the store wrote there.
#[cfg(feature = "redis")]
#[allow(clippy::unwrap_used)]
pub async fn node(port: u16) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}
