//! The bench's command-line options.

use std::path::PathBuf;

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
    /// Concurrent tasks driving each row.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Measured time per row in milliseconds (overrides the mode's; the
    /// warm-up is a fifth of it). For tests.
    #[arg(long, hide = true)]
    pub duration_ms: Option<u64>,
    /// Keys (and records) written to measure Redis memory per key.
    #[arg(long, default_value_t = 100_000, hide = true)]
    pub memory_keys: usize,
    /// Skip the `redis-benchmark` ceiling.
    #[arg(long)]
    pub no_ceiling: bool,
    /// Measure memory per key on the `--redis` server itself rather than on
    /// a private `redis-server` started for it.
    #[arg(long)]
    pub memory_on_target: bool,
    /// Also measure `idempotency.cycle` and `idempotency.replay` on a SQL
    /// store (`postgres://...` or `sqlite://PATH`, WAL mode), in a table of
    /// their own that is dropped afterwards. May be given twice (one
    /// PostgreSQL, one SQLite).
    #[arg(long = "database", value_name = "URL")]
    pub databases: Vec<String>,
    /// Also measure the SQL rows on SQLite in a temporary file (WAL mode),
    /// when no `--database sqlite://...` is given.
    #[arg(long)]
    pub sql_rows: bool,
    /// The nodes of a Redis Cluster (`redis://host:port`, comma-separated):
    /// adds the row `fingerprint.acquire.cluster`, measured there whatever
    /// `--redis` is.
    #[arg(long = "cluster", value_name = "URL", value_delimiter = ',')]
    pub cluster: Vec<String>,
    /// Also measure `fingerprint.acquire.replicas0` and `.replicas1`: the
    /// same claims on a master with one replica linked to it (two
    /// `redis-server`s started for it), through `?replicas=0` and
    /// `?replicas=1` (each claim answered once the replica has it), side
    /// by side: what the wait costs.
    #[arg(long)]
    pub replicas: bool,
    /// Measure only this row (may be given more than once), without the
    /// memory figures and the ceiling: for profiling one path.
    #[arg(long = "only", value_name = "ROW",
          value_parser = clap::builder::PossibleValuesParser::new(super::rows::RESULT_NAMES))]
    pub only: Vec<String>,
    /// Run every row this many times, each round all rows in turn (a row
    /// beside its anchor), and report each figure's median over the
    /// rounds and its range; each ratio is the median of the rounds'.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub rounds: u16,
    /// The `norepeat-gateway` binary of the gateway rows (default: the
    /// one next to this executable).
    #[arg(long = "gateway", env = "NOREPEAT_GATEWAY_BIN", value_name = "PATH")]
    pub gateway_bin: Option<PathBuf>,
    /// An earlier build of `norepeat-gateway`: adds the rows
    /// `gateway.before.passthrough`, `.guarded` and `.idempotency`, each
    /// beside the current build's.
    #[arg(
        long = "gateway-before",
        env = "NOREPEAT_GATEWAY_BEFORE_BIN",
        value_name = "PATH"
    )]
    pub gateway_before_bin: Option<PathBuf>,
    /// The `nginx` of the NGINX rows (default: on the `PATH` or in
    /// `/usr/sbin`).
    #[arg(long = "nginx", env = "NOREPEAT_NGINX_BIN", value_name = "PATH")]
    pub nginx_bin: Option<PathBuf>,
    /// The `idempotent-proxy-server` (1.2.2) of the
    /// `gateway.idempotent_proxy*` rows (default: on the `PATH`).
    #[arg(
        long = "idempotent-proxy",
        env = "NOREPEAT_IDEMPOTENT_PROXY_BIN",
        value_name = "PATH"
    )]
    pub idempotent_proxy_bin: Option<PathBuf>,
    /// Run as the gateway rows' load generator (a JSON spec, written by
    /// the bench itself) and print what it measured. Internal.
    #[arg(long, hide = true, value_name = "SPEC")]
    pub load_generator: Option<String>,
}
