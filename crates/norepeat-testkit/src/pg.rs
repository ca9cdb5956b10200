//! A fresh PostgreSQL database per test.

use sqlx::Connection as _;

use crate::util::random_hex;

/// Environment variable that overrides the admin URL used to create and drop
/// test databases.
pub const PG_ADMIN_URL_ENV: &str = "NOREPEAT_TEST_PG_ADMIN_URL";

/// Admin URL used when [`PG_ADMIN_URL_ENV`] is not set.
pub const DEFAULT_PG_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// A newly created, empty PostgreSQL database named `nr_test_<random hex>`.
///
/// The database is created through the admin URL (`NOREPEAT_TEST_PG_ADMIN_URL`,
/// default `postgres://postgres@127.0.0.1:5432/postgres`) and dropped with
/// `DROP DATABASE ... WITH (FORCE)` when the value is dropped (or explicitly
/// with [`drop_now`](Self::drop_now)). Errors while dropping are logged, not
/// raised.
///
/// ```no_run
/// use norepeat_testkit::PgDatabase;
///
/// # async fn demo() {
/// let db = PgDatabase::fresh().await;
/// let pool = db.pool().await;
/// sqlx::query("CREATE TABLE t (id int)").execute(&pool).await.expect("create table");
/// pool.close().await;
/// db.drop_now().await;
/// # }
/// ```
#[derive(Debug)]
pub struct PgDatabase {
    admin_url: String,
    name: String,
    url: String,
    dropped: bool,
}

impl PgDatabase {
    /// Creates a new database and returns its handle.
    ///
    /// # Panics
    ///
    /// Panics when PostgreSQL cannot be reached through the admin URL or
    /// refuses `CREATE DATABASE`.
    pub async fn fresh() -> PgDatabase {
        let admin_url = Self::admin_url();
        let name = format!("nr_test_{}", random_hex(8));
        let mut conn = sqlx::PgConnection::connect(&admin_url)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "norepeat-testkit: cannot connect to PostgreSQL admin URL {admin_url} \
                     (set {PG_ADMIN_URL_ENV} to override): {e}"
                )
            });
        // The name is generated here from hex digits only: no injection possible.
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("norepeat-testkit: CREATE DATABASE {name}: {e}"));
        if let Err(e) = conn.close().await {
            tracing::debug!(error = %e, "closing PostgreSQL admin connection");
        }
        let url = with_database(&admin_url, &name);
        tracing::debug!(%name, "created test database");
        PgDatabase {
            admin_url,
            name,
            url,
            dropped: false,
        }
    }

    /// The admin URL in effect: `NOREPEAT_TEST_PG_ADMIN_URL` or
    /// [`DEFAULT_PG_ADMIN_URL`].
    pub fn admin_url() -> String {
        std::env::var(PG_ADMIN_URL_ENV)
            .ok()
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_PG_ADMIN_URL.to_owned())
    }

    /// Connection URL of this database, e.g.
    /// `postgres://postgres@127.0.0.1:5432/nr_test_0123abcd4567ef89`.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The `host:port` of the server this database lives on, from the admin
    /// URL (`127.0.0.1:5432` by default): where a [`crate::proxy::TcpProxy`] in
    /// front of it forwards.
    ///
    /// # Panics
    ///
    /// Panics when the admin URL names no `host:port` that resolves.
    pub fn server(&self) -> std::net::SocketAddr {
        let (_, authority) = split_authority(&self.url);
        let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        std::net::ToSocketAddrs::to_socket_addrs(host_port)
            .ok()
            .and_then(|mut addrs| addrs.next())
            .unwrap_or_else(|| {
                panic!("norepeat-testkit: the admin URL's `{host_port}` is not a host:port")
            })
    }

    /// This database's URL with the server's `host:port` replaced by
    /// `addr`, keeping the user, password and options of the admin URL: the
    /// URL of this database seen through a proxy at `addr`.
    pub fn url_through(&self, addr: std::net::SocketAddr) -> String {
        let (scheme, authority) = split_authority(&self.url);
        let rest = &self.url[scheme.len() + authority.len()..];
        let user = authority.rsplit_once('@').map(|(u, _)| u);
        match user {
            Some(user) => format!("{scheme}{user}@{addr}{rest}"),
            None => format!("{scheme}{addr}{rest}"),
        }
    }

    /// The database name (`nr_test_<hex>`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A small connection pool on this database.
    ///
    /// Close it (or drop it) before dropping the database; `DROP DATABASE
    /// ... WITH (FORCE)` terminates leftover connections anyway.
    ///
    /// # Panics
    ///
    /// Panics when the database cannot be reached.
    pub async fn pool(&self) -> sqlx::PgPool {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(5)
            .connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("norepeat-testkit: cannot connect to {}: {e}", self.url))
    }

    /// True when a database called `name` exists (checked through the admin URL).
    ///
    /// # Panics
    ///
    /// Panics when PostgreSQL cannot be reached.
    pub async fn exists(name: &str) -> bool {
        let admin_url = Self::admin_url();
        let mut conn = sqlx::PgConnection::connect(&admin_url)
            .await
            .unwrap_or_else(|e| panic!("norepeat-testkit: cannot connect to {admin_url}: {e}"));
        let count: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_database WHERE datname = $1")
            .bind(name)
            .fetch_one(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("norepeat-testkit: querying pg_database: {e}"));
        if let Err(e) = conn.close().await {
            tracing::debug!(error = %e, "closing PostgreSQL admin connection");
        }
        count > 0
    }

    /// Drops the database now (asynchronously). Errors are logged.
    pub async fn drop_now(mut self) {
        self.dropped = true;
        if let Err(e) = drop_database(&self.admin_url, &self.name).await {
            tracing::warn!(name = %self.name, error = %e, "cannot drop test database");
        }
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        self.dropped = true;
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        // Drop is synchronous and may run inside a tokio runtime: do the async
        // work on a separate thread with its own small runtime.
        let worker = std::thread::Builder::new()
            .name("norepeat-testkit-pg-drop".to_owned())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::warn!(%name, error = %e, "cannot build runtime to drop test database");
                        return;
                    }
                };
                if let Err(e) = runtime.block_on(drop_database(&admin_url, &name)) {
                    tracing::warn!(%name, error = %e, "cannot drop test database");
                }
            });
        match worker {
            Ok(handle) => {
                if handle.join().is_err() {
                    tracing::warn!(name = %self.name, "test database drop thread panicked");
                }
            }
            Err(e) => {
                tracing::warn!(name = %self.name, error = %e, "cannot spawn test database drop thread");
            }
        }
    }
}

/// `DROP DATABASE IF EXISTS "name" WITH (FORCE)` through `admin_url`.
async fn drop_database(admin_url: &str, name: &str) -> Result<(), sqlx::Error> {
    let mut conn = sqlx::PgConnection::connect(admin_url).await?;
    // `name` is always `nr_test_<hex>`, generated by this module.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
    )))
    .execute(&mut conn)
    .await?;
    conn.close().await?;
    tracing::debug!(%name, "dropped test database");
    Ok(())
}

/// Replaces the database (path) part of a PostgreSQL URL, keeping any query string.
/// `url` split as `(scheme and "://", authority)`: the authority is what
/// lies between `://` and the next `/` or `?`.
fn split_authority(url: &str) -> (&str, &str) {
    let start = url.find("://").map_or(0, |i| i + 3);
    let end = url[start..]
        .find(['/', '?'])
        .map_or(url.len(), |i| start + i);
    (&url[..start], &url[start..end])
}

fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let base = match base[authority_start..].find('/') {
        Some(i) => &base[..authority_start + i],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    }
}

#[cfg(test)]
mod tests {
    use super::{PgDatabase, with_database};

    fn database(url: &str) -> PgDatabase {
        PgDatabase {
            admin_url: url.to_owned(),
            name: "x".to_owned(),
            url: with_database(url, "x"),
            // Never dropped: no server behind it.
            dropped: true,
        }
    }

    #[test]
    fn the_url_through_a_proxy_keeps_the_password_and_options() {
        let proxy = "127.0.0.1:6000".parse().unwrap();
        let db = database("postgres://postgres:secret@127.0.0.1:5432/postgres?sslmode=disable");
        assert_eq!(db.server(), "127.0.0.1:5432".parse().unwrap());
        assert_eq!(
            db.url_through(proxy),
            "postgres://postgres:secret@127.0.0.1:6000/x?sslmode=disable"
        );
        let db = database("postgres://postgres@127.0.0.1:5433/postgres");
        assert_eq!(db.server(), "127.0.0.1:5433".parse().unwrap());
        assert_eq!(
            db.url_through(proxy),
            "postgres://postgres@127.0.0.1:6000/x"
        );
        assert_eq!(
            database("postgres://127.0.0.1:5432/postgres").url_through(proxy),
            "postgres://127.0.0.1:6000/x"
        );
    }

    #[test]
    fn with_database_replaces_path() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/postgres", "x"),
            "postgres://postgres@127.0.0.1:5432/x"
        );
        assert_eq!(
            with_database("postgres://u:p@h:1/db?sslmode=disable", "x"),
            "postgres://u:p@h:1/x?sslmode=disable"
        );
        assert_eq!(with_database("postgres://h", "x"), "postgres://h/x");
    }
}
