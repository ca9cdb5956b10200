//! `#[norepeat::guard(mode = once, tx = tx)]` on a message consumer, on a
//! real PostgreSQL database and a SQLite file: the body's write and the
//! stored result commit in one transaction, so a redelivered message writes
//! nothing, and a delivery dropped before its commit leaves nothing.
//!
//! Every case runs once per backend (modules `postgres` and `sqlite`).
#![cfg(any(feature = "postgres", feature = "sqlite"))]
#![allow(clippy::unwrap_used)]

use norepeat::attribute::Rejected;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

#[derive(Debug)]
enum Error {
    Refused(Rejected),
    Db(#[allow(dead_code)] String), // read through `Debug` when a test fails
}
impl From<Rejected> for Error {
    fn from(r: Rejected) -> Self {
        Error::Refused(r)
    }
}
impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        Error::Db(e.to_string())
    }
}

struct Msg {
    id: String,
    user: String,
    points: i64,
}

/// Stamps the cases for one backend: `$store` the norepeat store type,
/// `$backend` the test kit's database of that backend (`SqlBackend`).
macro_rules! cases {
    ($store:ty, $backend:ty) => {
        use super::*;
        use norepeat_testkit::SqlBackend;

        type Db = <$backend as SqlBackend>::Database;

        struct Consumer {
            store: $store,
            /// When set, the body stops after its write (not committed) and
            /// says so on `written`.
            stall: bool,
            written: Arc<Notify>,
        }

        impl Consumer {
            /// Awards the message's points and records the message, in one
            /// transaction; returns the points awarded.
            #[norepeat::guard(store = self.store, key = "{msg.id}", mode = once, lease = "1s", tx = tx)]
            async fn award(&self, msg: &Msg) -> Result<i64, Error> {
                sqlx::query("INSERT INTO points (user_id, n) VALUES ($1, $2)")
                    .bind(&msg.user)
                    .bind(msg.points)
                    .execute(&mut *tx)
                    .await?;
                if self.stall {
                    self.written.notify_one();
                    std::future::pending::<()>().await;
                }
                Ok(msg.points)
            }
        }

        async fn setup(url: &str) -> (sqlx::Pool<Db>, $store) {
            let pool: sqlx::Pool<Db> = <$backend as SqlBackend>::pool(url).await;
            let store = <$store>::new(pool.clone());
            store.migrate().await.unwrap();
            sqlx::query("CREATE TABLE points (user_id TEXT NOT NULL, n BIGINT NOT NULL)")
                .execute(&pool)
                .await
                .unwrap();
            (pool, store)
        }

        async fn rows(pool: &sqlx::Pool<Db>) -> i64 {
            sqlx::query_scalar("SELECT COUNT(*) FROM points")
                .fetch_one(pool)
                .await
                .unwrap()
        }

        fn msg(points: i64) -> Msg {
            Msg {
                id: "m-1".into(),
                user: "u1".into(),
                points,
            }
        }

        #[tokio::test]
        async fn three_deliveries_write_one_row_and_give_one_result() {
            let (url, _db) = <$backend as SqlBackend>::fresh_with_url().await;
            let (pool, store) = setup(&url).await;
            let consumer = Consumer {
                store,
                stall: false,
                written: Arc::default(),
            };
            // Redeliveries carry other points: the body must not run again.
            for points in [30, 31, 32] {
                assert_eq!(consumer.award(&msg(points)).await.unwrap(), 30);
            }
            assert_eq!(rows(&pool).await, 1);
        }

        #[tokio::test]
        async fn a_delivery_dropped_before_its_commit_leaves_no_row() {
            let (url, _db) = <$backend as SqlBackend>::fresh_with_url().await;
            let (pool, store) = setup(&url).await;
            let stalling = Consumer {
                store: store.clone(),
                stall: true,
                written: Arc::default(),
            };
            let first = msg(30);
            {
                let delivery = stalling.award(&first);
                tokio::pin!(delivery);
                tokio::select! {
                    _ = &mut delivery => panic!("the stalled delivery finished"),
                    () = stalling.written.notified() => {}
                }
                // Dropped here: after the write, before the commit.
            }
            assert_eq!(rows(&pool).await, 0, "the write was rolled back");
            let consumer = Consumer {
                store,
                stall: false,
                written: Arc::default(),
            };
            // The dropped call's claim holds until its lease (1 s) ends.
            assert!(matches!(
                consumer.award(&msg(31)).await,
                Err(Error::Refused(Rejected::InProgress))
            ));
            // Then (and a second for clocks that disagree) the next
            // delivery takes the abandoned claim over: it ran no effect.
            tokio::time::sleep(Duration::from_millis(2300)).await;
            for _ in 0..2 {
                assert_eq!(consumer.award(&msg(31)).await.unwrap(), 31);
            }
            assert_eq!(rows(&pool).await, 1);
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

/// The documented `run_once_in_tx` example (a one-connection SQLite pool)
/// with a body longer than a third of the lease: the first renewal is due
/// while the body holds the pool's only connection in its transaction.
/// Before, `Claim::run` stopped polling the body while that renewal waited
/// for the connection, so neither moved until the pool's acquire timeout
/// (30 s) and the lease was lost; now the body runs on, the renewal gives
/// up after its budget, and the body commits well within its lease.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn run_once_in_tx_on_one_connection_outlives_a_third_of_its_lease() {
    use norepeat::attribute::Guarded;
    use norepeat::store::SqliteStore;
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect("sqlite::memory:")
        .await
        .unwrap();
    sqlx::query("CREATE TABLE points (user_id TEXT, n INTEGER)")
        .execute(&pool)
        .await
        .unwrap();
    let store = SqliteStore::new(pool.clone());
    store.migrate().await.unwrap();
    let lease = Duration::from_millis(900);
    let once = Guarded::once("points::award").lease(lease);
    for delivery in 0..3 {
        let awarded: Result<i64, Error> = tokio::time::timeout(
            Duration::from_secs(10),
            once.run_once_in_tx(&store, "order-7", |mut tx| async move {
                sqlx::query("INSERT INTO points VALUES ('u1', 30)")
                    .execute(&mut *tx)
                    .await?;
                // Past the first renewal (at a third of the lease), well
                // before the lease ends.
                tokio::time::sleep(lease / 2).await;
                Ok::<_, Error>((tx, 30))
            }),
        )
        .await
        .unwrap_or_else(|_| {
            panic!("delivery {delivery}: the body and its renewal waited on each other")
        });
        assert_eq!(awarded.unwrap(), 30, "delivery {delivery}");
    }
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM points")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);
}
