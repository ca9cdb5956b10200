//! The storm's command-line options.

/// The storm's options.
#[derive(Debug, Clone, clap::Args)]
pub struct StormArgs {
    /// Shop instances to start, sharing one store and one database.
    #[arg(long, default_value_t = 2)]
    pub instances: usize,
    /// Requests per row (scenario × defence), approximately.
    #[arg(long, default_value_t = 200)]
    pub requests: usize,
    /// Guard store shared by the instances (default: one in-process memory store).
    #[arg(long = "redis", env = "REDIS_URL")]
    pub redis_url: Option<String>,
    /// Database shared by the instances (default: a fresh SQLite file in the temp directory).
    #[arg(long = "database", env = "DATABASE_URL")]
    pub database_url: Option<String>,
    /// Shops already running (repeatable): drive them instead of starting
    /// shops. Needs `NOREPEAT_ADMIN_TOKEN` to stock the storm's product.
    #[arg(long = "target")]
    pub targets: Vec<String>,
    /// Admin token of the `--target` shops.
    #[arg(long, env = "NOREPEAT_ADMIN_TOKEN")]
    pub admin_token: Option<String>,
    /// Defences to run (repeatable, or comma-separated): `naive`, `db`,
    /// `guard+db`, `full`, `gateway` (naive shops behind two
    /// `norepeat-gateway` instances sharing the `--redis` store). Default:
    /// all of them, `gateway` only when `--redis` is given.
    #[arg(long = "defence", value_name = "NAME", value_delimiter = ',',
          value_parser = clap::builder::PossibleValuesParser::new(super::DEFENCES))]
    pub defences: Vec<String>,
    /// Print one JSON object on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
}
