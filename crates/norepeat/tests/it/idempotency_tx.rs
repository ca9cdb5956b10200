// Over 400 lines: each crash point of one transaction, on PostgreSQL and SQLite, sharing one handler and its checks.
//! Transactional completion on a real PostgreSQL database and a SQLite
//! file: the handler's write and the completed idempotency record commit in
//! one transaction, so no crash, dropped future or lost lease can leave the
//! effect with the key free.
//!
//! Every case runs once per backend (modules `postgres` and `sqlite`).
//!
//! Over 400 lines: one macro stamps every case for both SQL backends; a split
//! would repeat the backend set-up and the steered handler.
#![cfg(any(feature = "postgres", feature = "sqlite"))]
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::body::Body;
use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http::{HeaderMap, Request, StatusCode};
use norepeat_testkit::send;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A request to the test route, as `user` with `key`.
fn request(user: &str, key: &str, body: &str, steer: &[(&str, &str)]) -> Request<Body> {
    let mut b = Request::post("/pay")
        .header("x-user-id", user)
        .header("idempotency-key", key)
        .header("content-type", "application/json");
    for (n, v) in steer {
        b = b.header(*n, *v);
    }
    b.body(Body::from(body.to_owned())).unwrap()
}

/// Stamps the cases for one backend: `$store` the norepeat store type,
/// `$backend` the test kit's database of that backend (`SqlBackend`).
macro_rules! cases {
    ($store:ty, $backend:ty) => {
        use super::*;
        use norepeat_testkit::SqlBackend;

        type Db = <$backend as SqlBackend>::Database;
        use norepeat::idempotency::{IdempotencyLayer, IdempotentTx, TxError};
        use norepeat::store::KeyValueStoreExt;

        type Pool = sqlx::Pool<Db>;

        #[derive(Clone)]
        struct App {
            pool: Pool,
            runs: Arc<AtomicUsize>,
            /// Told once the handler's write is made (not committed).
            written: Arc<std::sync::Mutex<Option<std::sync::mpsc::Sender<()>>>>,
        }

        /// Inserts one effect row in a transaction, then commits it with the
        /// completed record. Headers steer it: `x-sleep-ms` pauses after the
        /// write, `x-hang` never commits.
        async fn pay(
            State(app): State<App>,
            Extension(idem): Extension<IdempotentTx<$store>>,
            headers: HeaderMap,
            body: String,
        ) -> Response {
            let run = app.runs.fetch_add(1, Ordering::SeqCst) + 1;
            let mut tx = app.pool.begin().await.unwrap();
            sqlx::query("INSERT INTO effects (note) VALUES ($1)")
                .bind(&body)
                .execute(&mut *tx)
                .await
                .unwrap();
            if let Some(tell) = app.written.lock().unwrap().take() {
                let _ = tell.send(());
            }
            if headers.contains_key("x-hang") {
                std::future::pending::<()>().await;
            }
            if let Some(ms) = headers.get("x-sleep-ms") {
                let ms = ms.to_str().unwrap().parse().unwrap();
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            let res = (
                StatusCode::CREATED,
                [("content-type", "application/json")],
                format!("{{\"run\":{run},\"note\":{body:?}}}"),
            )
                .into_response();
            match idem.commit(tx, res).await {
                Ok(res) => res.into_response(),
                Err(TxError::Lost) => StatusCode::CONFLICT.into_response(),
                Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
            }
        }

        async fn setup(url: &str, lease: Duration) -> (Router, App, $store) {
            setup_capped(url, lease, 1 << 20).await
        }

        /// [`setup`] with the layer's `max_body` at `cap`.
        async fn setup_capped(url: &str, lease: Duration, cap: usize) -> (Router, App, $store) {
            let pool: Pool = <$backend as SqlBackend>::pool(url).await;
            let store = <$store>::new(pool.clone());
            store.migrate().await.unwrap();
            sqlx::query("CREATE TABLE IF NOT EXISTS effects (note TEXT NOT NULL)")
                .execute(&pool)
                .await
                .unwrap();
            let app = App {
                pool,
                runs: Arc::default(),
                written: Arc::default(),
            };
            // The effect commits with the record: an abandoned claim's
            // transaction never committed, so a repeat takes it over.
            let layer = IdempotencyLayer::new(store.clone())
                .route("/pay")
                .lease(lease)
                .lease_renewal(false)
                .abandoned(norepeat::idempotency::Abandoned::Retry)
                .max_body(cap);
            let router = Router::new()
                .route("/pay", post(pay).layer(layer))
                .with_state(app.clone());
            (router, app, store)
        }

        async fn effects(pool: &Pool) -> i64 {
            sqlx::query_scalar("SELECT COUNT(*) FROM effects")
                .fetch_one(pool)
                .await
                .unwrap()
        }

        /// An answer over `max_body` commits with its effect, its record
        /// without the body: the client gets it whole, a retry gets the
        /// status, an empty body and `Idempotent-Body: omitted`, and the
        /// effect is not made again (before: `TxError::Body`, the effect
        /// rolled back and the client answered 503).
        #[tokio::test]
        async fn an_answer_over_the_cap_commits_and_replays_without_its_body() {
            let (url, _db) = <$backend as SqlBackend>::fresh_with_url().await;
            let (router, app, _) = setup_capped(&url, Duration::from_secs(10), 8).await;
            let first = send(&router, request("u1", "k-big", "\"a\"", &[])).await;
            assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
            assert!(first.body.len() > 8, "the client gets it whole");
            let again = send(&router, request("u1", "k-big", "\"a\"", &[])).await;
            assert_eq!(again.status, StatusCode::CREATED);
            assert_eq!(again.headers["idempotent-replayed"], "true");
            assert_eq!(again.headers["idempotent-body"], "omitted");
            assert!(again.body.is_empty());
            assert_eq!(app.runs.load(Ordering::SeqCst), 1, "not run again");
            assert_eq!(effects(&app.pool).await, 1, "one effect");
        }

        #[tokio::test]
        async fn the_effect_and_the_record_commit_together_and_replay() {
            let (url, _db) = <$backend as SqlBackend>::fresh_with_url().await;
            let (router, app, _) = setup(&url, Duration::from_secs(10)).await;
            let first = send(&router, request("u1", "k1", "\"a\"", &[])).await;
            assert_eq!(first.status, StatusCode::CREATED);
            assert!(!first.headers.contains_key("idempotent-replayed"));
            let again = send(&router, request("u1", "k1", "\"a\"", &[])).await;
            assert_eq!(again.status, StatusCode::CREATED);
            assert_eq!(again.headers["idempotent-replayed"], "true");
            assert_eq!(again.headers["content-type"], "application/json");
            assert_eq!(again.body, first.body, "replay byte for byte");
            // Another body with the key: 422, no run.
            let other = send(&router, request("u1", "k1", "\"b\"", &[])).await;
            assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
            assert_eq!(app.runs.load(Ordering::SeqCst), 1);
            assert_eq!(effects(&app.pool).await, 1);
        }

        /// A handler that outlives its lease while another request takes
        /// the key over: its commit finds the claim gone and rolls back.
        #[tokio::test]
        async fn a_lost_lease_rolls_the_effect_back() {
            let (url, _db) = <$backend as SqlBackend>::fresh_with_url().await;
            let (router, app, _) = setup(&url, Duration::from_millis(150)).await;
            let slow = tokio::spawn({
                let router = router.clone();
                async move {
                    send(
                        &router,
                        request("u1", "k", "\"x\"", &[("x-sleep-ms", "2500")]),
                    )
                    .await
                }
            });
            // Once the first has its claim (its handler runs), a retry is
            // told to wait until that claim's lease (not renewed) ends, and
            // the second allowed for clocks, then takes the claim over
            // (before the first, 2.5 s long, tries to commit). (On SQLite the retry's claim waits for the
            // first's open write to roll back.) Polled: no fixed delay can
            // tell a busy machine's "has claimed" and "has lost its lease".
            crate::common::eventually("the first has claimed", || async {
                (app.runs.load(Ordering::SeqCst) == 1).then_some(())
            })
            .await;
            let retry = crate::common::eventually("the first's lease ends", || async {
                let a = send(&router, request("u1", "k", "\"x\"", &[])).await;
                (a.status != StatusCode::CONFLICT).then_some(a)
            })
            .await;
            let slow = slow.await.unwrap();
            // SQLite has one writer: the take-over's write waits for the
            // first's open transaction, which commits its record first; the
            // take-over then finds the key completed and replays it. One
            // effect either way.
            let sqlite = std::any::type_name::<$store>().contains("Sqlite");
            let (owner, stale) = if sqlite && slow.status == StatusCode::CREATED {
                (&slow, &retry)
            } else {
                (&retry, &slow)
            };
            assert_eq!(owner.status, StatusCode::CREATED, "{:?}", owner.body);
            if std::ptr::eq(owner, &slow) {
                assert!(stale.headers.contains_key("idempotent-replayed"));
            } else {
                assert_eq!(
                    stale.status,
                    StatusCode::CONFLICT,
                    "the stale commit is refused"
                );
                assert_eq!(app.runs.load(Ordering::SeqCst), 2);
            }
            assert_eq!(
                effects(&app.pool).await,
                1,
                "only the owner's effect committed"
            );
            // The record is the owner's.
            let replay = send(&router, request("u1", "k", "\"x\"", &[])).await;
            assert_eq!(replay.headers["idempotent-replayed"], "true");
            assert_eq!(replay.body, owner.body);
        }

        /// The process dies (its runtime is torn down, every task dropped)
        /// after the handler's write and before its commit: no effect, the
        /// claim stays until its lease ends, then a retry runs once.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_crash_before_commit_leaves_no_effect_and_the_retry_runs_once() {
            let (url, _db) = <$backend as SqlBackend>::fresh_with_url().await;
            let lease = Duration::from_millis(1500);
            let (tell, written) = std::sync::mpsc::channel();
            let (die, dying) = tokio::sync::oneshot::channel::<()>();
            let crash_url = url.clone();
            let process = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let (router, app, _) = setup(&crash_url, lease).await;
                    *app.written.lock().unwrap() = Some(tell);
                    tokio::spawn(async move {
                        send(&router, request("u1", "k", "\"x\"", &[("x-hang", "1")])).await
                    });
                    let _ = dying.await;
                });
                // The crash: every task (the handler and its open
                // transaction, the layer's claim) is dropped mid-flight, and
                // the connections close.
                drop(rt);
            });
            tokio::task::block_in_place(|| {
                written.recv_timeout(Duration::from_secs(30)).unwrap();
                die.send(()).unwrap();
                process.join().unwrap();
            });
            let (router, app, _) = setup(&url, lease).await;
            assert_eq!(effects(&app.pool).await, 0, "the uncommitted write is gone");
            // The claim is still open: a retry at once is told to wait.
            let early = send(&router, request("u1", "k", "\"x\"", &[])).await;
            assert_eq!(early.status, StatusCode::CONFLICT, "{:?}", early.body);
            assert_eq!(app.runs.load(Ordering::SeqCst), 0);
            // Once the lease has run out (and the second the clocks of two
            // instances may disagree by), the retry takes the claim over
            // and runs, once.
            tokio::time::sleep(lease + Duration::from_millis(1_300)).await;
            let retry = send(&router, request("u1", "k", "\"x\"", &[])).await;
            assert_eq!(retry.status, StatusCode::CREATED);
            let replay = send(&router, request("u1", "k", "\"x\"", &[])).await;
            assert_eq!(replay.headers["idempotent-replayed"], "true");
            assert_eq!(app.runs.load(Ordering::SeqCst), 1);
            assert_eq!(effects(&app.pool).await, 1);
        }

        #[derive(Debug)]
        enum ConsumerError {
            Rejected(norepeat::attribute::Rejected),
            Db,
        }
        impl From<norepeat::attribute::Rejected> for ConsumerError {
            fn from(r: norepeat::attribute::Rejected) -> Self {
                ConsumerError::Rejected(r)
            }
        }
        impl From<sqlx::Error> for ConsumerError {
            fn from(_: sqlx::Error) -> Self {
                ConsumerError::Db
            }
        }

        /// `Guarded::run_once_in_tx`: the points and the record of the
        /// message commit together. Redeliveries get the stored result; a
        /// delivery dropped before its commit leaves nothing and, once the
        /// lease ends, the next delivery runs once; a delivery that lost its
        /// claim rolls back.
        #[tokio::test]
        async fn guarded_once_in_tx_awards_once() {
            use norepeat::attribute::{Guarded, Rejected};
            let (url, _db) = <$backend as SqlBackend>::fresh_with_url().await;
            let (_, app, store) = setup(&url, Duration::from_secs(10)).await;
            let pool = app.pool.clone();
            // Long enough that the "still open" check below cannot outlast
            // it on a slow machine; the end of it is polled.
            let lease = Duration::from_secs(1);
            let once = Guarded::once("points").lease(lease);
            let wrote = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let award = |note: &'static str, pause: Duration| {
                let once = once.clone();
                let store = store.clone();
                let wrote = Arc::clone(&wrote);
                async move {
                    once.run_once_in_tx(&store, "order-1", |mut tx| async move {
                        sqlx::query("INSERT INTO effects (note) VALUES ($1)")
                            .bind(note)
                            .execute(&mut *tx)
                            .await?;
                        wrote.store(true, Ordering::SeqCst);
                        tokio::time::sleep(pause).await;
                        Ok::<_, ConsumerError>((tx, note.to_owned()))
                    })
                    .await
                }
            };
            // A delivery dropped after its write (seen, not assumed after a
            // fixed delay), before its commit.
            crate::common::drop_when(
                award("dropped", Duration::from_secs(5)),
                "the write",
                || wrote.load(Ordering::SeqCst),
            )
            .await;
            assert_eq!(effects(&pool).await, 0, "no effect without the commit");
            // The claim is open until its lease ends.
            assert!(matches!(
                award("early", Duration::ZERO).await,
                Err(ConsumerError::Rejected(Rejected::InProgress))
            ));
            let first = crate::common::eventually("the dropped claim's lease ends", || async {
                match award("first", Duration::ZERO).await {
                    Err(ConsumerError::Rejected(Rejected::InProgress)) => None,
                    other => Some(other),
                }
            })
            .await;
            assert_eq!(first.unwrap(), "first");
            for _ in 0..3 {
                assert_eq!(award("again", Duration::ZERO).await.unwrap(), "first");
            }
            assert_eq!(effects(&pool).await, 1);
        }

        /// A message consumer with the store's primitive: claim, then the
        /// effect and the completion in one transaction. A redelivery finds
        /// the record; a consumer whose claim lapsed and was taken over
        /// cannot commit.
        #[tokio::test]
        async fn a_consumer_records_the_message_with_its_effect() {
            let (url, _db) = <$backend as SqlBackend>::fresh_with_url().await;
            let (_, app, store) = setup(&url, Duration::from_secs(10)).await;
            let ttl = Duration::from_secs(60);
            async fn consume(
                store: &$store,
                pool: &Pool,
                msg: &str,
                owner: &[u8],
                lease: Duration,
                pause: Duration,
                claimed: &std::sync::atomic::AtomicBool,
            ) -> Result<bool, TxError> {
                if store.put_if_absent(msg, owner, lease).await?.is_some() {
                    return Ok(false); // done, or someone else is on it
                }
                claimed.store(true, Ordering::SeqCst);
                let mut tx = pool.begin().await.unwrap();
                sqlx::query("INSERT INTO effects (note) VALUES ($1)")
                    .bind(msg)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                tokio::time::sleep(pause).await;
                if !store
                    .replace_if_equals_in(&mut tx, msg, owner, b"done", Duration::from_secs(60))
                    .await?
                {
                    tx.rollback().await.unwrap();
                    return Err(TxError::Lost);
                }
                tx.commit().await.unwrap();
                Ok(true)
            }
            let pool = &app.pool;
            let no = std::sync::atomic::AtomicBool::new(false);
            assert!(
                consume(&store, pool, "m1", b"a", ttl, Duration::ZERO, &no)
                    .await
                    .unwrap()
            );
            assert!(
                !consume(&store, pool, "m1", b"b", ttl, Duration::ZERO, &no)
                    .await
                    .unwrap()
            );
            assert_eq!(effects(pool).await, 1);
            // Lost claim: `a` sleeps past its lease, `b` takes the message.
            // `b` starts once `a` has claimed (seen, not assumed after a
            // fixed delay) and tries until `a`'s lease has ended.
            let short = Duration::from_millis(100);
            let a_claimed = std::sync::atomic::AtomicBool::new(false);
            let slow = consume(
                &store,
                pool,
                "m2",
                b"a",
                short,
                Duration::from_millis(400),
                &a_claimed,
            );
            let other = async {
                crate::common::eventually("`a` claims", || async {
                    a_claimed.load(Ordering::SeqCst).then_some(())
                })
                .await;
                crate::common::eventually("`a`'s lease ends", || async {
                    match consume(&store, pool, "m2", b"b", ttl, Duration::ZERO, &no).await {
                        Ok(false) => None,
                        other => Some(other),
                    }
                })
                .await
            };
            let (slow, other) = tokio::join!(slow, other);
            assert!(matches!(slow, Err(TxError::Lost)), "{slow:?}");
            assert!(other.unwrap());
            assert_eq!(effects(pool).await, 2, "m1 once, m2 once");
        }
    };
}

#[cfg(feature = "postgres")]
mod postgres {
    cases!(norepeat::store::PgStore, norepeat_testkit::PgDatabase);
}

#[cfg(feature = "sqlite")]
mod sqlite {
    cases!(norepeat::store::SqliteStore, norepeat_testkit::SqliteFile);
}
