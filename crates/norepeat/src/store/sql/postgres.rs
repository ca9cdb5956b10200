//! What the PostgreSQL store does its own way.

impl super::sealed::Sealed for sqlx::Postgres {
    const KIND: &'static str = "postgres";
    // `statement_timestamp()`: the same for the whole statement, and the
    // statement's start (not the transaction's, as `now()` would be).
    const NOW_MS: &'static str =
        "(floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint)";
    // Concurrent reapers skip each other's rows (and rows a caller holds)
    // instead of waiting for them.
    const REAP_LOCK: &'static str = " FOR UPDATE SKIP LOCKED";

    fn ddl(table: &str, index: &str) -> Vec<String> {
        vec![
            // Instances starting together would otherwise race on the
            // catalogue (`CREATE TABLE IF NOT EXISTS` is not safe against a
            // concurrent create). The lock is released at commit.
            format!("SELECT pg_advisory_xact_lock(hashtext('norepeat migrate {table}'))"),
            format!(
                "CREATE TABLE IF NOT EXISTS {table} (\
                 key TEXT PRIMARY KEY, \
                 value BYTEA NOT NULL, \
                 expires_at BIGINT NOT NULL, \
                 nonce BIGINT NOT NULL)"
            ),
            format!("CREATE INDEX IF NOT EXISTS {index} ON {table} (expires_at)"),
        ]
    }
}
