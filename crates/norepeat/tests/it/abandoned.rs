//! A process killed with `SIGKILL` while its idempotent handler runs: the
//! claim it leaves is an unknown outcome, never a free key.
//!
//! The layer runs in a child process (this test binary run again, as its
//! ignored test `abandoned::child_server`), on a real Redis, PostgreSQL
//! database or SQLite file. Its handler writes the effect (a line in a file, written
//! and synced before it waits) and then hangs; the test kills the child
//! with `SIGKILL`, and retries the same request through a layer of its own
//! on the same store:
//!
//! - at once: 409 `idempotency_key_in_use` (the lease has not passed);
//! - after the lease: 409 `idempotency_outcome_unknown` (default), for as
//!   long as the record lives; the handler never runs again;
//! - with `Abandoned::Retry`: the retry takes the claim over and runs as
//!   attempt 2 (two effects, which the handler can tell apart), and its
//!   answer is then replayed.
//!
//! Before records carried their lease, the claim ended with its lease and
//! the retry after it ran the handler a second time (two effects).

// Outside `#[test]` functions too (the app, the child process): a test
// helper that cannot do its part fails the test.
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::body::Body;
use axum::extract::Extension;
use axum::routing::post;
use http::{Request, StatusCode};
use norepeat::idempotency::{Abandoned, Attempt, IdempotencyLayer};
use norepeat::store::KeyValueStore;
use norepeat_testkit::{Answer, PgDatabase, RedisServer, SqlBackend, SqliteFile, free_port, send};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The lease of both the child's layer and the test's own.
const LEASE: Duration = Duration::from_millis(1_500);

/// The environment that makes `child_server` serve.
const STORE_ENV: &str = "NOREPEAT_CHILD_STORE";
const PORT_ENV: &str = "NOREPEAT_CHILD_PORT";
const EFFECTS_ENV: &str = "NOREPEAT_CHILD_EFFECTS";

/// Where a test's layer keeps its records.
#[derive(Debug, Clone)]
enum StoreAt {
    Redis(String),
    Postgres(String),
    Sqlite(String),
}

impl StoreAt {
    fn to_env(&self) -> String {
        match self {
            StoreAt::Redis(url) => format!("redis {url}"),
            StoreAt::Postgres(url) => format!("postgres {url}"),
            StoreAt::Sqlite(url) => format!("sqlite {url}"),
        }
    }

    fn from_env(s: &str) -> Self {
        let (kind, at) = s.split_once(' ').expect("kind and address");
        match kind {
            "redis" => StoreAt::Redis(at.to_owned()),
            "postgres" => StoreAt::Postgres(at.to_owned()),
            "sqlite" => StoreAt::Sqlite(at.to_owned()),
            other => panic!("no store kind {other}"),
        }
    }
}

/// The app: `POST /pay` writes its effect (with its attempt number) to
/// `effects`, then hangs when asked to (`x-hang`), else answers 201.
fn app<G: KeyValueStore + Clone>(store: G, abandoned: Abandoned, effects: PathBuf) -> Router {
    let layer = IdempotencyLayer::new(store)
        .lease(LEASE)
        .abandoned(abandoned)
        .route("/pay");
    let handler = move |Extension(attempt): Extension<Attempt>, req: Request<Body>| {
        let effects = effects.clone();
        async move {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&effects)
                .unwrap();
            writeln!(f, "attempt {}", attempt.get()).unwrap();
            f.sync_all().unwrap();
            if req.headers().contains_key("x-hang") {
                std::future::pending::<()>().await;
            }
            (
                StatusCode::CREATED,
                format!("{{\"attempt\":{}}}", attempt.get()),
            )
        }
    };
    Router::new().route("/pay", post(handler).layer(layer))
}

/// Serves [`app`] on `store` until `serve` ends.
async fn serve_on(store: StoreAt, abandoned: Abandoned, effects: PathBuf, port: u16) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let router = with_store(store, abandoned, effects).await;
    axum::serve(listener, router).await.unwrap();
}

/// [`app`] over the store at `store`.
async fn with_store(store: StoreAt, abandoned: Abandoned, effects: PathBuf) -> Router {
    match store {
        StoreAt::Redis(url) => {
            let s = norepeat::store::RedisStore::connect(&url).await.unwrap();
            app(s, abandoned, effects)
        }
        StoreAt::Postgres(url) => {
            let pool = <PgDatabase as SqlBackend>::pool(&url).await;
            let s = norepeat::store::PgStore::new(pool);
            s.migrate().await.unwrap();
            app(s, abandoned, effects)
        }
        StoreAt::Sqlite(url) => {
            let pool = SqliteFile::pool(&url).await;
            let s = norepeat::store::SqliteStore::new(pool);
            s.migrate().await.unwrap();
            app(s, abandoned, effects)
        }
    }
}

/// [`child_server`]'s name in this test binary: its module path (without
/// the binary's own name) and the function's.
const CHILD_TEST: &str = "abandoned::child_server";

/// The child's entry: this test binary, run again by the tests below with
/// this test's name, `--ignored` and the environment that says where to
/// serve. Run by hand, without that environment, it has nothing to serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of the tests in this file, started by them"]
async fn child_server() {
    let store = StoreAt::from_env(&std::env::var(STORE_ENV).expect("run by the tests only"));
    let port = std::env::var(PORT_ENV).unwrap().parse().unwrap();
    let effects = PathBuf::from(std::env::var(EFFECTS_ENV).unwrap());
    serve_on(store, Abandoned::OutcomeUnknown, effects, port).await;
}

/// The child process, killed on drop.
struct Child(std::process::Child, u16);

impl Child {
    async fn start(store: &StoreAt, effects: &Path) -> Child {
        let port = free_port();
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([CHILD_TEST, "--exact", "--ignored", "--nocapture"])
            .env(STORE_ENV, store.to_env())
            .env(PORT_ENV, port.to_string())
            .env(EFFECTS_ENV, effects)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        crate::common::eventually("the child listens", || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()
                .map(|_| ())
        })
        .await;
        Child(child, port)
    }

    /// `SIGKILL`: the process ends mid-request, nothing runs after it.
    fn kill(&mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn pay(hang: bool) -> Request<Body> {
    let mut req = Request::post("/pay")
        .header("x-user-id", "u1")
        .header("idempotency-key", "order-7-payment")
        .header("content-type", "application/json");
    if hang {
        req = req.header("x-hang", "1");
    }
    req.body(Body::from(r#"{"amount":1999}"#)).unwrap()
}

/// The effects written so far, one line each.
fn effects(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A file for the effects, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(what: &str) -> Self {
        Self(std::env::temp_dir().join(format!(
            "norepeat-abandoned-{what}-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        )))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The child claims the key, writes its effect and is killed; then the
/// test's own layer on the same store answers the retries.
async fn killed_mid_handler(store: StoreAt, abandoned: Abandoned) -> (Router, TempFile) {
    let file = TempFile::new("effects");
    let mut child = Child::start(&store, &file.0).await;
    let port = child.1;
    let request = tokio::spawn(async move {
        // Through a real connection: the child is another process.
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let body = r#"{"amount":1999}"#;
        let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let head = format!(
            "POST /pay HTTP/1.1\r\nhost: child\r\nx-user-id: u1\r\nidempotency-key: order-7-payment\r\ncontent-type: application/json\r\nx-hang: 1\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        conn.write_all(head.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        let _ = conn.read_to_end(&mut answer).await;
        answer
    });
    crate::common::eventually("the child's handler wrote its effect", || async {
        (effects(&file.0).len() == 1).then_some(())
    })
    .await;
    child.kill();
    assert!(
        request.await.unwrap().is_empty(),
        "the killed child answered"
    );
    let router = with_store(store, abandoned, file.0.clone()).await;
    (router, file)
}

fn code(answer: &Answer) -> String {
    answer.json()["code"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Default: 409 in use while the lease lasts, then 409 outcome unknown,
/// and the handler never runs again.
async fn a_killed_owner_is_an_unknown_outcome(store: StoreAt) {
    let (router, file) = killed_mid_handler(store, Abandoned::OutcomeUnknown).await;
    let early = send(&router, pay(false)).await;
    assert_eq!(early.status, StatusCode::CONFLICT, "{:?}", early.body);
    assert_eq!(code(&early), "idempotency_key_in_use");
    tokio::time::sleep(LEASE + Duration::from_millis(300)).await;
    for _ in 0..3 {
        let late = send(&router, pay(false)).await;
        assert_eq!(late.status, StatusCode::CONFLICT, "{:?}", late.body);
        assert_eq!(code(&late), "idempotency_outcome_unknown");
    }
    assert_eq!(effects(&file.0), ["attempt 1"], "the handler ran again");
}

/// `Abandoned::Retry`: once the lease (and the clocks' allowance) has
/// passed, one retry takes the claim over and runs as attempt 2; its
/// answer is replayed after.
async fn a_killed_owner_is_taken_over_as_attempt_2(store: StoreAt) {
    let (router, file) = killed_mid_handler(store, Abandoned::Retry).await;
    let early = send(&router, pay(false)).await;
    assert_eq!(code(&early), "idempotency_key_in_use");
    let retry = crate::common::eventually("the abandoned claim is taken over", || async {
        let a = send(&router, pay(false)).await;
        (a.status != StatusCode::CONFLICT).then_some(a)
    })
    .await;
    assert_eq!(retry.status, StatusCode::CREATED, "{:?}", retry.body);
    assert_eq!(retry.json()["attempt"], 2);
    let replay = send(&router, pay(false)).await;
    assert_eq!(replay.headers["idempotent-replayed"], "true");
    assert_eq!(replay.body, retry.body);
    assert_eq!(effects(&file.0), ["attempt 1", "attempt 2"]);
}

mod redis {
    use super::*;

    async fn store() -> (RedisServer, StoreAt) {
        let redis = RedisServer::start().await;
        let at = StoreAt::Redis(redis.url());
        (redis, at)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn killed_owner_is_an_unknown_outcome() {
        let (_redis, at) = store().await;
        a_killed_owner_is_an_unknown_outcome(at).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn killed_owner_is_taken_over_as_attempt_2() {
        let (_redis, at) = store().await;
        a_killed_owner_is_taken_over_as_attempt_2(at).await;
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn killed_owner_is_an_unknown_outcome() {
        let db = norepeat_testkit::PgDatabase::fresh().await;
        a_killed_owner_is_an_unknown_outcome(StoreAt::Postgres(db.url())).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn killed_owner_is_taken_over_as_attempt_2() {
        let db = norepeat_testkit::PgDatabase::fresh().await;
        a_killed_owner_is_taken_over_as_attempt_2(StoreAt::Postgres(db.url())).await;
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn killed_owner_is_an_unknown_outcome() {
        let db = norepeat_testkit::SqliteFile::new();
        a_killed_owner_is_an_unknown_outcome(StoreAt::Sqlite(db.url())).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn killed_owner_is_taken_over_as_attempt_2() {
        let db = norepeat_testkit::SqliteFile::new();
        a_killed_owner_is_taken_over_as_attempt_2(StoreAt::Sqlite(db.url())).await;
    }
}
