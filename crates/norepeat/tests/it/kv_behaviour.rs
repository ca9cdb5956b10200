// Over 400 lines: one behaviour table run on four stores; apart, each store would repeat the table.
//! One behaviour table for every key-value store: memory, Redis (a private
//! redis-server), PostgreSQL (a fresh database) and SQLite (a temporary
//! file). Each case runs once per backend, through [`KeyValueStore`] only.
//!
//! Plus the SQL reaper: it deletes expired rows and only those, while
//! callers claim and revive keys at the same time.
//!
//! Over 400 lines: it is the one behaviour table, stamped per backend by one
//! macro; a split would be one table in several places.
#![allow(clippy::unwrap_used)]

use norepeat::store::KeyValueStore;
use norepeat::store::KeyValueStoreExt;
use std::time::Duration;

/// Long enough never to lapse during a case.
const LONG: Duration = Duration::from_secs(60);
/// Short enough to lapse within a case.
const SHORT: Duration = Duration::from_millis(150);

/// Waits until a key written with [`SHORT`] has expired, with margin.
async fn lapse() {
    tokio::time::sleep(SHORT + Duration::from_millis(150)).await;
}

/// Whether `key` holds `value` (probing with a `put_if_absent` that cannot
/// win: if the key is absent, the probe stores and then removes itself).
async fn holds<S: KeyValueStore>(s: &S, key: &str, value: &[u8]) -> bool {
    match s.put_if_absent(key, b"probe", LONG).await.unwrap() {
        Some(v) => v.as_ref() == value,
        None => {
            assert!(s.delete_if_equals(key, b"probe").await.unwrap());
            false
        }
    }
}

async fn absent<S: KeyValueStore>(s: &S, key: &str) -> bool {
    match s.put_if_absent(key, b"probe", LONG).await.unwrap() {
        Some(_) => false,
        None => {
            assert!(s.delete_if_equals(key, b"probe").await.unwrap());
            true
        }
    }
}

/// The cases, each a function of a store.
mod cases {
    use super::*;
    use std::collections::HashSet;

    pub async fn put_if_absent<S: KeyValueStore>(s: S) {
        // Absent: stored.
        assert_eq!(s.put_if_absent("k", b"a", LONG).await.unwrap(), None);
        // Present: the value there comes back, and nothing changes.
        assert_eq!(
            s.put_if_absent("k", b"b", LONG).await.unwrap().as_deref(),
            Some(&b"a"[..])
        );
        // Present with an equal value: still not stored (SET NX GET).
        assert_eq!(
            s.put_if_absent("k", b"a", LONG).await.unwrap().as_deref(),
            Some(&b"a"[..])
        );
        assert!(holds(&s, "k", b"a").await);
        // Expired: absent, so stored.
        assert_eq!(s.put_if_absent("e", b"old", SHORT).await.unwrap(), None);
        lapse().await;
        assert_eq!(s.put_if_absent("e", b"new", LONG).await.unwrap(), None);
        assert!(holds(&s, "e", b"new").await);
        // Expired and written again with the same value: stored too.
        assert_eq!(s.put_if_absent("same", b"v", SHORT).await.unwrap(), None);
        lapse().await;
        assert_eq!(s.put_if_absent("same", b"v", LONG).await.unwrap(), None);
        // Values are bytes: empty and non-UTF-8 values round-trip.
        assert_eq!(
            s.put_if_absent("bin", &[0, 255, 1], LONG).await.unwrap(),
            None
        );
        assert_eq!(
            s.put_if_absent("bin", b"x", LONG).await.unwrap().as_deref(),
            Some(&[0u8, 255, 1][..])
        );
        assert_eq!(s.put_if_absent("empty", b"", LONG).await.unwrap(), None);
        assert_eq!(
            s.put_if_absent("empty", b"x", LONG)
                .await
                .unwrap()
                .as_deref(),
            Some(&b""[..])
        );
        // Keys are distinct.
        let keys: HashSet<_> = ["k", "k ", "K", "k/1"].into_iter().collect();
        for k in &keys {
            s.put_if_absent(k, k.as_bytes(), LONG).await.unwrap();
        }
        for k in keys.iter().filter(|k| **k != "k") {
            assert!(holds(&s, k, k.as_bytes()).await, "{k}");
        }
    }

    pub async fn delete_if_equals<S: KeyValueStore>(s: S) {
        // Absent.
        assert!(!s.delete_if_equals("k", b"a").await.unwrap());
        // Present, someone else's value: kept.
        s.put_if_absent("k", b"a", LONG).await.unwrap();
        assert!(!s.delete_if_equals("k", b"b").await.unwrap());
        assert!(holds(&s, "k", b"a").await);
        // Present, ours: gone, once.
        assert!(s.delete_if_equals("k", b"a").await.unwrap());
        assert!(!s.delete_if_equals("k", b"a").await.unwrap());
        assert!(absent(&s, "k").await);
        // Expired with our value: absent, so nothing to delete.
        s.put_if_absent("e", b"a", SHORT).await.unwrap();
        lapse().await;
        assert!(!s.delete_if_equals("e", b"a").await.unwrap());
        assert!(absent(&s, "e").await);
    }

    pub async fn expire_if_equals<S: KeyValueStore>(s: S) {
        // Absent: nothing to renew, and renewing does not create.
        assert!(!s.expire_if_equals("k", b"a", LONG).await.unwrap());
        assert!(absent(&s, "k").await);
        // Present, someone else's: the TTL stays short.
        s.put_if_absent("k", b"a", SHORT).await.unwrap();
        assert!(!s.expire_if_equals("k", b"b", LONG).await.unwrap());
        lapse().await;
        assert!(absent(&s, "k").await);
        // Present, ours: renewed past its first TTL.
        s.put_if_absent("r", b"a", SHORT).await.unwrap();
        assert!(s.expire_if_equals("r", b"a", LONG).await.unwrap());
        lapse().await;
        assert!(holds(&s, "r", b"a").await);
        // Renewing can shorten as well.
        assert!(s.expire_if_equals("r", b"a", SHORT).await.unwrap());
        lapse().await;
        assert!(absent(&s, "r").await);
        // Expired with our value: too late, and it stays absent.
        s.put_if_absent("e", b"a", SHORT).await.unwrap();
        lapse().await;
        assert!(!s.expire_if_equals("e", b"a", LONG).await.unwrap());
        assert!(absent(&s, "e").await);
    }

    pub async fn replace_if_equals<S: KeyValueStore>(s: S) {
        // Absent: nothing replaced, nothing created.
        assert!(!s.replace_if_equals("k", b"a", b"b", LONG).await.unwrap());
        assert!(absent(&s, "k").await);
        // Present, someone else's: unchanged.
        s.put_if_absent("k", b"a", LONG).await.unwrap();
        assert!(!s.replace_if_equals("k", b"x", b"b", LONG).await.unwrap());
        assert!(holds(&s, "k", b"a").await);
        // Present, ours: new value, and the new TTL applies.
        s.put_if_absent("c", b"claim", SHORT).await.unwrap();
        assert!(
            s.replace_if_equals("c", b"claim", b"done", LONG)
                .await
                .unwrap()
        );
        lapse().await;
        assert!(holds(&s, "c", b"done").await);
        // The old value no longer matches.
        assert!(
            !s.replace_if_equals("c", b"claim", b"again", LONG)
                .await
                .unwrap()
        );
        // A shorter new TTL applies too.
        assert!(
            s.replace_if_equals("c", b"done", b"brief", SHORT)
                .await
                .unwrap()
        );
        lapse().await;
        assert!(absent(&s, "c").await);
        // Expired with our value: absent, nothing replaced or created.
        s.put_if_absent("e", b"a", SHORT).await.unwrap();
        lapse().await;
        assert!(!s.replace_if_equals("e", b"a", b"b", LONG).await.unwrap());
        assert!(absent(&s, "e").await);
    }

    pub async fn ttl_expiry<S: KeyValueStore>(s: S) {
        s.put_if_absent("k", b"a", SHORT).await.unwrap();
        assert!(holds(&s, "k", b"a").await);
        lapse().await;
        assert!(absent(&s, "k").await);
        // A zero TTL still writes (at least a millisecond), and expires.
        assert_eq!(
            s.put_if_absent("z", b"a", Duration::ZERO).await.unwrap(),
            None
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(absent(&s, "z").await);
    }

    /// A claim that expired and was taken over: the first owner can neither
    /// renew, complete nor release the new owner's claim.
    pub async fn owner_checked<S: KeyValueStore>(s: S) {
        assert_eq!(
            s.put_if_absent("job", b"owner-a", SHORT).await.unwrap(),
            None
        );
        lapse().await;
        assert_eq!(
            s.put_if_absent("job", b"owner-b", LONG).await.unwrap(),
            None
        );
        assert!(!s.expire_if_equals("job", b"owner-a", LONG).await.unwrap());
        assert!(
            !s.replace_if_equals("job", b"owner-a", b"done-a", LONG)
                .await
                .unwrap()
        );
        assert!(!s.delete_if_equals("job", b"owner-a").await.unwrap());
        assert!(holds(&s, "job", b"owner-b").await);
        // The new owner completes; a repeat of the first owner still fails.
        assert!(
            s.replace_if_equals("job", b"owner-b", b"done-b", LONG)
                .await
                .unwrap()
        );
        assert!(!s.delete_if_equals("job", b"owner-b").await.unwrap());
        assert_eq!(
            s.put_if_absent("job", b"owner-c", LONG)
                .await
                .unwrap()
                .as_deref(),
            Some(&b"done-b"[..])
        );
    }

    /// `Duration::MAX` as a lease or a retention saturates (to a TTL the
    /// store can hold) instead of panicking or being refused, and the key
    /// still has a TTL. Before: the memory store panicked (`Instant +
    /// Duration` overflow) and Redis refused the `PX` ("invalid expire
    /// time").
    pub async fn longest_ttl<S: KeyValueStore>(s: S) {
        let max = Duration::MAX;
        assert_eq!(s.put_if_absent("forever", b"a", max).await.unwrap(), None);
        assert!(holds(&s, "forever", b"a").await);
        assert!(s.expire_if_equals("forever", b"a", max).await.unwrap());
        assert!(
            s.replace_if_equals("forever", b"a", b"b", max)
                .await
                .unwrap()
        );
        assert!(holds(&s, "forever", b"b").await);
        assert!(s.delete_if_equals("forever", b"b").await.unwrap());
        assert!(absent(&s, "forever").await);
    }

    /// Many tasks claim one key at once, each with its own value: exactly
    /// one stores, and every other one is told the winner's value.
    pub async fn concurrent_claims<S: KeyValueStore + Clone>(s: S) {
        for round in 0..3 {
            let key = format!("race-{round}");
            let tasks: Vec<_> = (0..50)
                .map(|i| {
                    let s = s.clone();
                    let key = key.clone();
                    tokio::spawn(async move {
                        let mine = format!("owner-{i}").into_bytes();
                        let got = s.put_if_absent(&key, &mine, LONG).await.unwrap();
                        (mine, got)
                    })
                })
                .collect();
            let mut winners = Vec::new();
            let mut seen = Vec::new();
            for t in tasks {
                let (mine, got) = t.await.unwrap();
                match got {
                    None => winners.push(mine),
                    Some(v) => seen.push(v.to_vec()),
                }
            }
            assert_eq!(winners.len(), 1, "round {round}: {} winners", winners.len());
            assert_eq!(seen.len(), 49);
            assert!(seen.iter().all(|v| *v == winners[0]), "round {round}");
            assert!(holds(&s, &key, &winners[0]).await);
        }
        // The same over an expired row: exactly one revives it.
        s.put_if_absent("stale", b"old", SHORT).await.unwrap();
        lapse().await;
        let tasks: Vec<_> = (0..50)
            .map(|i| {
                let s = s.clone();
                tokio::spawn(async move {
                    s.put_if_absent("stale", format!("o{i}").as_bytes(), LONG)
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut stored = 0;
        for t in tasks {
            match t.await.unwrap() {
                None => stored += 1,
                Some(v) => assert_ne!(v.as_ref(), b"old"),
            }
        }
        assert_eq!(stored, 1);
    }
}

/// One test per (backend, case): `$make` is an async block giving a fresh
/// store and whatever must stay alive while it is used.
macro_rules! behaviour {
    ($backend:ident, $make:expr) => {
        mod $backend {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn put_if_absent() {
                let (store, _keep) = $make;
                cases::put_if_absent(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn delete_if_equals() {
                let (store, _keep) = $make;
                cases::delete_if_equals(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn expire_if_equals() {
                let (store, _keep) = $make;
                cases::expire_if_equals(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn replace_if_equals() {
                let (store, _keep) = $make;
                cases::replace_if_equals(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn ttl_expiry() {
                let (store, _keep) = $make;
                cases::ttl_expiry(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn owner_checked() {
                let (store, _keep) = $make;
                cases::owner_checked(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn longest_ttl() {
                let (store, _keep) = $make;
                cases::longest_ttl(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_claims() {
                let (store, _keep) = $make;
                cases::concurrent_claims(store).await;
            }
        }
    };
}

behaviour!(memory, (norepeat::store::MemoryStore::new(10_000), ()));

#[cfg(feature = "redis")]
behaviour!(redis, {
    let server = norepeat_testkit::RedisServer::start().await;
    let store = norepeat::store::RedisStore::connect(&server.url())
        .await
        .unwrap();
    (store, server)
});

#[cfg(feature = "postgres")]
behaviour!(postgres, sql::postgres().await);

#[cfg(feature = "sqlite")]
behaviour!(
    sqlite,
    sql::sqlite(norepeat::store::sql::DEFAULT_REAP_BATCH).await
);

#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod sql {
    #[cfg(feature = "sqlite")]
    use norepeat::store::SqliteStore;
    #[cfg(feature = "postgres")]
    use norepeat::store::{PgStore, sql::DEFAULT_REAP_BATCH};
    #[cfg(feature = "postgres")]
    use norepeat_testkit::PgDatabase;
    use norepeat_testkit::SqlBackend;
    #[cfg(feature = "sqlite")]
    use norepeat_testkit::SqliteFile;

    /// A store on a fresh PostgreSQL database, migrated.
    #[cfg(feature = "postgres")]
    pub async fn postgres() -> (PgStore, PgDatabase) {
        postgres_with(DEFAULT_REAP_BATCH).await
    }

    #[cfg(feature = "postgres")]
    pub async fn postgres_with(batch: u32) -> (PgStore, PgDatabase) {
        let db = PgDatabase::fresh().await;
        let pool = <PgDatabase as SqlBackend>::pool(&db.url()).await;
        let store = PgStore::builder(pool).reap_batch(batch).build().unwrap();
        store.migrate().await.unwrap();
        (store, db)
    }

    /// A store on a new SQLite file (WAL, a pool of several connections),
    /// migrated.
    #[cfg(feature = "sqlite")]
    pub async fn sqlite(batch: u32) -> (SqliteStore, SqliteFile) {
        let file = SqliteFile::new();
        let pool = SqliteFile::pool(&file.url()).await;
        let store = SqliteStore::builder(pool)
            .reap_batch(batch)
            .build()
            .unwrap();
        store.migrate().await.unwrap();
        (store, file)
    }
}

/// The tests of the SQL stores only (reaper, migration, table), for one
/// backend: `$make(batch)` gives a fresh
/// store with that reaper batch size.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
macro_rules! sql_only {
    ($backend:ident, $make:path) => {
        mod $backend {
            use super::*;

            async fn rows(store: &impl HasPool, like: &str) -> i64 {
                store.count(like).await
            }

            /// Expired rows go, live ones stay, while two reapers and 300
            /// claims (half of them reviving expired keys) run at once.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn reaper_deletes_only_expired_rows_under_concurrent_claims() {
                let (store, _keep) = $make(7).await;
                for i in 0..200 {
                    let k = format!("old-{i}");
                    store
                        .put_if_absent(&k, b"stale", Duration::from_millis(1))
                        .await
                        .unwrap();
                }
                for i in 0..100 {
                    let k = format!("live-{i}");
                    store.put_if_absent(&k, b"live", LONG).await.unwrap();
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                assert_eq!(rows(&store, "%").await, 300);

                let reapers: Vec<_> = (0..2)
                    .map(|_| {
                        let s = store.clone();
                        tokio::spawn(async move {
                            let mut n = 0;
                            for _ in 0..3 {
                                n += s.reap_once().await.unwrap();
                            }
                            n
                        })
                    })
                    .collect();
                let claims: Vec<_> = (0..300)
                    .map(|i| {
                        let s = store.clone();
                        tokio::spawn(async move {
                            let k = if i < 200 {
                                format!("old-{i}")
                            } else {
                                format!("new-{i}")
                            };
                            if i < 200 && i % 2 == 1 {
                                return; // left expired, for the reapers
                            }
                            // Expired or reaped, the key is absent: the claim stores.
                            assert_eq!(
                                s.put_if_absent(&k, b"claimed", LONG).await.unwrap(),
                                None,
                                "{k}"
                            );
                        })
                    })
                    .collect();
                for c in claims {
                    c.await.unwrap();
                }
                let mut reaped = 0;
                for r in reapers {
                    reaped += r.await.unwrap();
                }
                reaped += store.reap_once().await.unwrap();
                // The 100 keys left expired went; the 100 revived ones went
                // at most once each (reaped before their revival).
                assert!((100..=200).contains(&reaped), "reaped {reaped}");
                assert_eq!(rows(&store, "old-%").await, 100);
                assert_eq!(rows(&store, "live-%").await, 100);
                assert_eq!(rows(&store, "new-%").await, 100);
                for i in (0..200).step_by(2) {
                    assert!(
                        holds(&store, &format!("old-{i}"), b"claimed").await,
                        "old-{i}"
                    );
                }
                for i in 0..100 {
                    assert!(
                        holds(&store, &format!("live-{i}"), b"live").await,
                        "live-{i}"
                    );
                }
                // Nothing expired is left for a last pass.
                assert_eq!(store.reap_once().await.unwrap(), 0);
            }

            /// The spawned reaper runs on its interval and stops when its
            /// handle is dropped.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn spawned_reaper_runs_until_dropped() {
                let (store, _keep) = $make(5).await;
                store.put_if_absent("keep", b"v", LONG).await.unwrap();
                let reaper = store.spawn_reaper(Duration::from_millis(20));
                for i in 0..12 {
                    let k = format!("x-{i}");
                    store
                        .put_if_absent(&k, b"v", Duration::from_millis(1))
                        .await
                        .unwrap();
                }
                let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
                while rows(&store, "x-%").await > 0 {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "the reaper never ran"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                drop(reaper);
                for i in 0..3 {
                    let k = format!("y-{i}");
                    store
                        .put_if_absent(&k, b"v", Duration::from_millis(1))
                        .await
                        .unwrap();
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                assert_eq!(
                    rows(&store, "y-%").await,
                    3,
                    "a dropped reaper kept reaping"
                );
                assert_eq!(store.reap_once().await.unwrap(), 3);
                assert_eq!(rows(&store, "%").await, 1);
            }

            /// The store's migration leaves sqlx's migration history alone, so
            /// an application's own `sqlx::migrate` keeps working next to it,
            /// before and after.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn migrate_coexists_with_application_migrations() {
                let (store, _keep) = $make(5).await;
                let dir = std::env::temp_dir().join(format!(
                    "norepeat-kv-migrations-{:016x}",
                    rand::random::<u64>()
                ));
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(
                    dir.join("0001_app.sql"),
                    "CREATE TABLE app_orders (id BIGINT PRIMARY KEY);",
                )
                .unwrap();
                let app = sqlx::migrate::Migrator::new(dir.as_path()).await.unwrap();
                app.run(store.pool()).await.unwrap();
                store.migrate().await.unwrap();
                app.run(store.pool()).await.unwrap();
                std::fs::write(
                    dir.join("0002_more.sql"),
                    "CREATE TABLE app_items (id BIGINT PRIMARY KEY);",
                )
                .unwrap();
                let app = sqlx::migrate::Migrator::new(dir.as_path()).await.unwrap();
                app.run(store.pool()).await.unwrap();
                let _ = std::fs::remove_dir_all(&dir);
                store.put_if_absent("k", b"v", LONG).await.unwrap();
                assert!(holds(&store, "k", b"v").await);
            }

            /// A store on another table of the same database is another
            /// key space.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn custom_table_is_its_own_key_space() {
                let (store, _keep) = $make(5).await;
                let other = norepeat::store::SqlStore::builder(store.pool().clone())
                    .table("other_claims")
                    .build()
                    .unwrap();
                assert_eq!(other.table(), "other_claims");
                other.migrate().await.unwrap();
                assert_eq!(store.put_if_absent("k", b"a", LONG).await.unwrap(), None);
                assert_eq!(other.put_if_absent("k", b"b", LONG).await.unwrap(), None);
                assert!(holds(&store, "k", b"a").await);
                assert!(holds(&other, "k", b"b").await);
                assert_eq!(rows(&store, "%").await, 1);
            }

            /// Migrating twice, and from several tasks at once (instances
            /// starting together, the table not there yet), is harmless.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn migrate_is_idempotent_and_concurrent_safe() {
                let (store, _keep) = $make(5).await;
                store.put_if_absent("k", b"v", LONG).await.unwrap();
                store.migrate().await.unwrap();
                for round in 0..5 {
                    let fresh = norepeat::store::SqlStore::builder(store.pool().clone())
                        .table(format!("fresh_{round}"))
                        .build()
                        .unwrap();
                    let runs: Vec<_> = (0..4)
                        .map(|_| {
                            let s = fresh.clone();
                            tokio::spawn(async move { s.migrate().await })
                        })
                        .collect();
                    for r in runs {
                        r.await.unwrap().unwrap();
                    }
                    assert_eq!(fresh.put_if_absent("k", b"w", LONG).await.unwrap(), None);
                }
                assert!(holds(&store, "k", b"v").await);
            }
        }
    };
}

/// Counting rows, for the reaper's tests.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
trait HasPool {
    async fn count(&self, like: &str) -> i64;
}

#[cfg(feature = "postgres")]
impl HasPool for norepeat::store::PgStore {
    async fn count(&self, like: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM norepeat_keys WHERE key LIKE $1")
            .bind(like)
            .fetch_one(self.pool())
            .await
            .unwrap()
    }
}

#[cfg(feature = "sqlite")]
impl HasPool for norepeat::store::SqliteStore {
    async fn count(&self, like: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM norepeat_keys WHERE key LIKE $1")
            .bind(like)
            .fetch_one(self.pool())
            .await
            .unwrap()
    }
}

#[cfg(feature = "postgres")]
sql_only!(postgres_table, sql::postgres_with);

#[cfg(feature = "sqlite")]
sql_only!(sqlite_table, sql::sqlite);
