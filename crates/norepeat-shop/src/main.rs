//! `norepeat`: the demo shop and its commands.

use clap::{Parser, Subcommand};
use norepeat_shop::commands;
use norepeat_shop::config::ShopConfig;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "norepeat",
    version,
    about = "A shop that stops duplicate submissions from becoming duplicate effects"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

/// `norepeat` with no command: serve with flags from the environment.
#[derive(Parser)]
struct ServeDefaults {
    #[command(flatten)]
    cfg: ShopConfig,
}

#[derive(Subcommand)]
enum Command {
    /// Run the shop (the default).
    Serve(ShopConfig),
    /// Replay the duplicate-submission incident and prove the fix.
    Storm(commands::storm::StormArgs),
    /// Measure the guards against the store.
    Bench(commands::bench::BenchArgs),
    /// Run one reconciliation pass and print what it repaired.
    Reconcile {
        /// Run once and exit (the only mode).
        #[arg(long)]
        once: bool,
        /// The database (`DATABASE_URL`).
        #[arg(long = "database", env = "DATABASE_URL")]
        database_url: Option<String>,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,norepeat=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("norepeat: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result: Result<ExitCode, String> = rt.block_on(async {
        match cli.command {
            None => {
                let cfg = ServeDefaults::parse_from(["norepeat"]).cfg;
                commands::serve::run(cfg).await.map_err(|e| e.to_string())?;
                Ok(ExitCode::SUCCESS)
            }
            Some(Command::Serve(cfg)) => {
                commands::serve::run(cfg).await.map_err(|e| e.to_string())?;
                Ok(ExitCode::SUCCESS)
            }
            Some(Command::Storm(args)) => {
                let json = args.json;
                let (rows, clean) = commands::storm::run(args)
                    .await
                    .map_err(|e| e.to_string())?;
                if json {
                    println!("{}", serde_json::json!({ "rows": rows }));
                } else {
                    print!("{}", commands::storm::table(&rows));
                    if !clean {
                        println!("a defended row has duplicates or oversold units");
                    }
                }
                Ok(if clean {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                })
            }
            Some(Command::Bench(args)) => {
                commands::bench::run(args).await?;
                Ok(ExitCode::SUCCESS)
            }
            Some(Command::Reconcile {
                once: _,
                database_url,
            }) => {
                let db = norepeat_shop::db::Db::connect(database_url.as_deref())
                    .await
                    .map_err(|e| e.to_string())?;
                let report = db.reconcile().await.map_err(|e| e.to_string())?;
                println!(
                    "{}",
                    serde_json::json!({"repaired": report.total(), "report": report})
                );
                Ok(ExitCode::SUCCESS)
            }
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("norepeat: {e}");
            ExitCode::FAILURE
        }
    }
}
