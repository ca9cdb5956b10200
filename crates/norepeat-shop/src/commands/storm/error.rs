//! What can stop a storm run.

/// Why the storm could not run.
#[derive(Debug, thiserror::Error)]
pub enum StormError {
    /// Starting the shops failed.
    #[error("{0}")]
    Start(#[from] crate::app::StartError),
    /// The database failed.
    #[error("database: {0}")]
    Db(#[from] crate::db::DbError),
    /// The `gateway` defence could not run (no binary, no Redis, a
    /// gateway that did not start).
    #[error("gateway defence: {0}")]
    Gateway(String),
    /// A target shop misbehaved.
    #[error("{0}")]
    Target(String),
}
