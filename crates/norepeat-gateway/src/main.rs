//! The `norepeat-gateway` binary: `check FILE` for now.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use norepeat_gateway::config::Config;

/// norepeat's guards in front of any HTTP backend, from one YAML file.
///
/// This build validates the file (`check`); serving it
/// (`--config FILE [--listen ADDR]`) is not built yet: it comes next.
#[derive(Parser)]
#[command(name = "norepeat-gateway", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate FILE: exit 0 printing `ok: N routes`, or exit 2 with one
    /// line per problem (file:line:column: field: message). Never serves.
    Check {
        /// The gateway's YAML file.
        file: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { file } => match Config::load(&file) {
            Ok(config) => {
                println!("ok: {} routes", config.routes.len());
                ExitCode::SUCCESS
            }
            Err(problems) => {
                eprint!("{problems}");
                ExitCode::from(2)
            }
        },
    }
}
