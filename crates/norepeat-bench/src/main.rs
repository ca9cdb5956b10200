//! `norepeat-bench`: the same command, flags and output as `norepeat bench`
//! on a binary of its own.

use clap::Parser;
use std::process::ExitCode;

/// mimalloc, as in the shop's `norepeat` binary: the rows measured in
/// process (the `http.*` servers, the guards) run on the same allocator
/// whichever binary runs the bench.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "norepeat-bench",
    version,
    about = "Measure the guards against the store (the same as `norepeat bench`)"
)]
struct Cli {
    #[command(flatten)]
    args: norepeat_bench::BenchArgs,
}

fn main() -> ExitCode {
    // Logs to stderr (stdout holds the report), `RUST_LOG` else warnings.
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("norepeat-bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let run = async {
        let me = norepeat_bench::SelfCommand::current(&[])?;
        norepeat_bench::run(cli.args, &me).await
    };
    match rt.block_on(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("norepeat-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
