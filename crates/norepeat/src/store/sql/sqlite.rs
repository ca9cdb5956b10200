//! What the SQLite store does its own way.

impl super::sealed::Sealed for sqlx::Sqlite {
    const KIND: &'static str = "sqlite";
    // `julianday('now')` is fixed for the statement (SQLite reads the clock
    // once per `sqlite3_step`), and works on every SQLite with `RETURNING`
    // (`unixepoch('subsec')` needs 3.42).
    const NOW_MS: &'static str = "(CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER))";
    // A writing statement holds SQLite's one write lock from start to end:
    // there is nothing to skip.
    const REAP_LOCK: &'static str = "";

    fn ddl(table: &str, index: &str) -> Vec<String> {
        vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {table} (\
                 key TEXT PRIMARY KEY NOT NULL, \
                 value BLOB NOT NULL, \
                 expires_at INTEGER NOT NULL, \
                 nonce INTEGER NOT NULL) WITHOUT ROWID"
            ),
            format!("CREATE INDEX IF NOT EXISTS {index} ON {table} (expires_at)"),
        ]
    }
}
