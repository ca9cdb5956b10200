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
    /// A target shop misbehaved.
    #[error("{0}")]
    Target(String),
}
