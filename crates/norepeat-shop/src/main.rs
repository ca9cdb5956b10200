//! `norepeat`: the demo shop and its commands.

use clap::{Parser, Subcommand};
use norepeat_shop::commands;
use norepeat_shop::commands::storm::InjectedFaults;
use norepeat_shop::config::ShopConfig;
use std::io::IsTerminal;
use std::process::ExitCode;
use tracing_subscriber::filter::FilterExt as _;
use tracing_subscriber::layer::{Layer as _, SubscriberExt as _};
use tracing_subscriber::util::SubscriberInitExt as _;

/// mimalloc rather than glibc's malloc: on the 2-core bench machine the
/// HTTP rows ran about a third faster, both with and without the guard, and
/// `idempotency.cycle` about a tenth (BENCHMARKS.md, "Another allocator"). The
/// library sets no allocator; this is the shop's choice.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "norepeat",
    version,
    about = "A shop that stops duplicate submissions from becoming duplicate effects",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// With no command: serve, with these flags (`norepeat --listen X` is
    /// `norepeat serve --listen X`).
    #[command(flatten)]
    cfg: ShopConfig,
}

#[derive(Subcommand)]
enum Command {
    /// Run the shop (the default).
    Serve(ShopConfig),
    /// Replay the duplicate-submission incident and prove the fix.
    Storm(commands::storm::StormArgs),
    /// Measure the guards against the store (the `norepeat-bench` crate).
    #[cfg(feature = "bench")]
    Bench(norepeat_bench::BenchArgs),
    /// Measure the guards against the store: this binary was built without
    /// the bench (feature `bench`); says how to get it.
    #[cfg(not(feature = "bench"))]
    Bench {
        /// The bench's flags (see `norepeat-bench --help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
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

/// How log lines are written to stderr (`NOREPEAT_LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LogFormat {
    /// Human-readable lines; coloured only when stderr is a terminal and
    /// `NO_COLOR` is unset or empty (<https://no-color.org>).
    Text,
    /// One JSON object per line, never coloured, for log collectors.
    Json,
}

impl LogFormat {
    /// Reads `NOREPEAT_LOG_FORMAT`: unset or empty is `text`.
    fn from_env() -> Result<LogFormat, String> {
        match std::env::var("NOREPEAT_LOG_FORMAT") {
            Err(std::env::VarError::NotPresent) => Ok(LogFormat::Text),
            Ok(v) if v.is_empty() || v.eq_ignore_ascii_case("text") => Ok(LogFormat::Text),
            Ok(v) if v.eq_ignore_ascii_case("json") => Ok(LogFormat::Json),
            Ok(v) => Err(format!(
                "NOREPEAT_LOG_FORMAT must be `text` or `json`, not `{v}`"
            )),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err("NOREPEAT_LOG_FORMAT must be `text` or `json`".to_owned())
            }
        }
    }
}

/// Installs the global subscriber: logs go to stderr (stdout stays for the
/// commands' output), filtered by `RUST_LOG` (default `warn,norepeat=info`).
/// With `faults` (the storm), the lines of the outages it injects are
/// counted there instead of printed.
fn init_logging(format: LogFormat, faults: Option<&InjectedFaults>) {
    let directives = std::env::var("RUST_LOG").ok();
    subscriber(directives.as_deref(), format, faults).init();
}

/// The subscriber [`init_logging`] installs. Every filter in it states its
/// level, so a line below the level is never built: a filter with no hint
/// (an `Option` of one that is `None`) would have every `debug` span of the
/// library's layers built on every request.
fn subscriber(
    directives: Option<&str>,
    format: LogFormat,
    faults: Option<&InjectedFaults>,
) -> impl tracing::Subscriber + Send + Sync + 'static {
    let filter = || {
        directives
            .and_then(|d| tracing_subscriber::EnvFilter::try_new(d).ok())
            .unwrap_or_else(|| "warn,norepeat=info".into())
    };
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Json => fmt.json().with_ansi(false).boxed(),
        LogFormat::Text => {
            let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
            fmt.with_ansi(std::io::stderr().is_terminal() && !no_color)
                .boxed()
        }
    };
    let fmt = match faults {
        Some(faults) => fmt.with_filter(filter().and(faults.hidden())).boxed(),
        None => fmt.with_filter(filter()).boxed(),
    };
    tracing_subscriber::registry()
        .with(fmt)
        .with(faults.map(InjectedFaults::counter))
}

fn main() -> ExitCode {
    let format = match LogFormat::from_env() {
        Ok(format) => format,
        Err(e) => {
            eprintln!("norepeat: {e}");
            return ExitCode::FAILURE;
        }
    };
    let cli = Cli::parse();
    let faults = matches!(cli.command, Some(Command::Storm(_))).then(InjectedFaults::default);
    init_logging(format, faults.as_ref());
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
                commands::serve::run(cli.cfg).await.map_err(|e| e.to_string())?;
                Ok(ExitCode::SUCCESS)
            }
            Some(Command::Serve(cfg)) => {
                commands::serve::run(cfg).await.map_err(|e| e.to_string())?;
                Ok(ExitCode::SUCCESS)
            }
            Some(Command::Storm(args)) => {
                let json = args.json;
                let faults = faults.unwrap_or_default();
                let (rows, clean) = commands::storm::run(args, &faults)
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
            #[cfg(feature = "bench")]
            Some(Command::Bench(args)) => {
                // The gateway rows start `norepeat bench --load-generator`.
                let me = norepeat_bench::SelfCommand::current(&["bench"])?;
                norepeat_bench::run(args, &me).await?;
                Ok(ExitCode::SUCCESS)
            }
            #[cfg(not(feature = "bench"))]
            Some(Command::Bench { args: _ }) => {
                eprintln!(
                    "norepeat: this binary was built without the bench (the demo does not need it).\n\
                     Build it with:  cargo run --profile bench-release -p norepeat-shop --features bench -- bench ...\n\
                     or run the bench's own binary:  cargo run --profile bench-release -p norepeat-bench -- ..."
                );
                Ok(ExitCode::from(2))
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

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Subscriber as _;
    use tracing::level_filters::LevelFilter;

    #[test]
    fn a_line_below_the_level_is_never_built() {
        let faults = InjectedFaults::default();
        for faults in [None, Some(&faults)] {
            for format in [LogFormat::Text, LogFormat::Json] {
                let log = subscriber(None, format, faults);
                let what = format!("{format:?}, faults {}", faults.is_some());
                assert_eq!(log.max_level_hint(), Some(LevelFilter::INFO), "{what}");
                tracing::subscriber::with_default(log, || {
                    assert!(
                        tracing::debug_span!("norepeat.decide").is_disabled(),
                        "{what}"
                    );
                });
            }
        }
        let log = subscriber(Some("debug"), LogFormat::Text, None);
        assert_eq!(log.max_level_hint(), Some(LevelFilter::DEBUG));
    }
}
