//! `norepeat bench`: measure the guards (being written).

/// The bench's options.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Store to measure (`redis://...`, `redis+cluster://...`); default memory.
    #[arg(long = "redis", env = "REDIS_URL")]
    pub redis_url: Option<String>,
    /// Finish within 60 s.
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Runs the bench and prints its report.
///
/// # Errors
/// When the store cannot be reached.
pub async fn run(args: BenchArgs) -> Result<(), String> {
    let _ = args;
    Err("not written yet".into())
}
