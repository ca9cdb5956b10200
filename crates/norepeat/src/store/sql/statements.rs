//! The SQL text of a store's operations, built once per table, and how a
//! database error becomes a [`StoreError`].

use super::SqlBackend;
use crate::store::StoreError;
use sqlx::AssertSqlSafe;
use std::sync::Arc;
use std::time::Duration;

pub(super) fn valid_identifier(part: &str) -> bool {
    let mut chars = part.chars();
    matches!(chars.next(), Some('a'..='z' | '_'))
        && part.len() <= 63
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
}

/// The statements of one store, built once for its table.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) put: Arc<str>,
    pub(super) delete: Arc<str>,
    pub(super) expire: Arc<str>,
    pub(super) replace: Arc<str>,
    pub(super) get: Arc<str>,
    pub(super) reap: Arc<str>,
    pub(super) ddl: Vec<Arc<str>>,
}

impl Statements {
    pub(super) fn new<DB: SqlBackend>(table: &str) -> Self {
        let now = DB::NOW_MS;
        let index = format!("{}_expires_at", table.rsplit('.').next().unwrap_or(table));
        let s = |sql: String| Arc::<str>::from(sql);
        Self {
            put: s(format!(
                "INSERT INTO {table} AS t (key, value, expires_at, nonce) \
                 VALUES ($1, $2, {now} + $3, $4) \
                 ON CONFLICT (key) DO UPDATE SET \
                 value = CASE WHEN t.expires_at <= {now} THEN excluded.value ELSE t.value END, \
                 expires_at = CASE WHEN t.expires_at <= {now} THEN excluded.expires_at ELSE t.expires_at END, \
                 nonce = CASE WHEN t.expires_at <= {now} THEN excluded.nonce ELSE t.nonce END \
                 RETURNING nonce = $4, value"
            )),
            delete: s(format!(
                "DELETE FROM {table} WHERE key = $1 AND value = $2 AND expires_at > {now}"
            )),
            expire: s(format!(
                "UPDATE {table} SET expires_at = {now} + $3 \
                 WHERE key = $1 AND value = $2 AND expires_at > {now}"
            )),
            replace: s(format!(
                "UPDATE {table} SET value = $3, expires_at = {now} + $4 \
                 WHERE key = $1 AND value = $2 AND expires_at > {now}"
            )),
            get: s(format!(
                "SELECT value FROM {table} WHERE key = $1 AND expires_at > {now}"
            )),
            reap: s(format!(
                "DELETE FROM {table} WHERE key IN (\
                 SELECT key FROM {table} WHERE expires_at <= {now} LIMIT $1{lock}\
                 ) AND expires_at <= {now}",
                lock = DB::REAP_LOCK
            )),
            ddl: DB::ddl(table, &index).into_iter().map(s).collect(),
        }
    }
}

/// Statement text for sqlx. The text was built from a checked table name
/// and constants only; every value is a bound parameter.
pub(super) fn sql(s: &Arc<str>) -> AssertSqlSafe<Arc<str>> {
    AssertSqlSafe(Arc::clone(s))
}

/// A TTL in milliseconds, at least 1, and small enough that `now + ttl`
/// cannot overflow a `BIGINT` (a cap of about 285,000 years).
pub(super) fn ttl_millis(ttl: Duration) -> i64 {
    i64::try_from(crate::store::ttl_ms(ttl)).unwrap_or(i64::MAX)
}

pub(super) fn map_err(e: sqlx::Error, acquire_timeout: Duration) -> StoreError {
    match e {
        sqlx::Error::PoolTimedOut => StoreError::Timeout(acquire_timeout),
        sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Configuration(_) => StoreError::Connection(e.to_string()),
        sqlx::Error::Database(_) => StoreError::Server(e.to_string()),
        _ => StoreError::Protocol(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_plain_identifiers() {
        for ok in ["norepeat_keys", "_t", "app.keys_2", "a"] {
            assert!(ok.split('.').all(valid_identifier), "{ok}");
        }
        for bad in [
            "",
            "Keys",
            "1t",
            "t-1",
            "t;drop",
            "a b",
            "\"t\"",
            &"x".repeat(64),
        ] {
            assert!(!bad.split('.').all(valid_identifier), "{bad}");
        }
    }

    #[test]
    fn ttl_is_at_least_a_millisecond_and_capped() {
        assert_eq!(ttl_millis(Duration::ZERO), 1);
        assert_eq!(ttl_millis(Duration::from_millis(1500)), 1500);
        assert_eq!(ttl_millis(Duration::MAX), 1 << 53);
    }
}
