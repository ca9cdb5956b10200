//! What can stop a bench run.

/// Why a bench run stopped.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The store named by `--redis` could not be reached.
    #[error("cannot reach the store: {0}")]
    Store(#[from] norepeat::store::StoreError),
    /// A plain Redis command of the bench (`INFO`, `DBSIZE`, `UNLINK`, the
    /// `redis.raw` row) failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// A row's operation did not give the answer the row measures (a
    /// refusal where an admission was due, an admission where a refusal
    /// was due, a status other than the expected one).
    #[error("{row}: {what}")]
    Unexpected {
        /// The row.
        row: &'static str,
        /// What happened instead.
        what: String,
    },
    /// The SQL store of the `idempotency.*.postgres` / `.sqlite` rows (its
    /// pool, or the table created and dropped for the run).
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// A `--database` URL that is neither `postgres://` nor `sqlite:`.
    #[error("--database {0:?}: expected postgres://... or sqlite://PATH")]
    DatabaseUrl(String),
    /// The loopback HTTP server of the `http.*` rows.
    #[error("loopback server: {0}")]
    Io(#[from] std::io::Error),
    /// The HTTP client of the `http.*` rows.
    #[error("http client: {0}")]
    Http(#[from] reqwest::Error),
    /// A driving task panicked or was cancelled.
    #[error("bench task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// A row completed nothing in its measured time.
    #[error("no operation completed in the measured time")]
    Empty,
    /// The memory probe could not read what it needs.
    #[error("memory probe: {0}")]
    Probe(String),
    /// `redis-benchmark` did not run or gave no figure.
    #[error("redis-benchmark: {0}")]
    Ceiling(String),
}

impl BenchError {
    /// A row got an answer it does not measure.
    pub(crate) fn unexpected(row: &'static str, what: impl Into<String>) -> Self {
        Self::Unexpected {
            row,
            what: what.into(),
        }
    }
}

/// `main` reports every command's failure as one line of text.
impl From<BenchError> for String {
    fn from(e: BenchError) -> Self {
        e.to_string()
    }
}

/// The URL without its password.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        _ => url.to_owned(),
    }
}
