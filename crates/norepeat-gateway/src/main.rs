//! The `norepeat-gateway` binary: `--config FILE [--listen ADDR]` serves,
//! `check FILE` validates.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use norepeat_gateway::config::Config;
use norepeat_gateway::serve::{Gateway, Workers, serve, serve_workers};

/// mimalloc rather than glibc's malloc, as the shop: a proxy allocates
/// headers, bodies and futures for every request, and glibc's malloc and
/// free were about 5 % of the gateway's CPU (BENCHMARKS.md, "The gateway").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// norepeat's guards in front of any HTTP backend, from one YAML file.
#[derive(Parser)]
#[command(
    name = "norepeat-gateway",
    version,
    args_conflicts_with_subcommands = true,
    after_help = ENVIRONMENT
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// The gateway's YAML file: serve it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Listen here instead of the file's `listen` (`127.0.0.1:0` picks a
    /// free port).
    #[arg(long, value_name = "ADDR", requires = "config")]
    listen: Option<SocketAddr>,
    /// How many event loops serve: one per core by default. Each is a
    /// thread of its own with its own listening socket (`SO_REUSEPORT`,
    /// the kernel spreading connections between them) and upstream pool,
    /// as NGINX's worker processes.
    #[arg(long, value_name = "N", requires = "config")]
    workers: Option<std::num::NonZeroUsize>,
    /// Serve on tokio's work-stealing runtime instead (one listening
    /// socket, `--workers` threads taking each other's tasks): for routes
    /// whose requests take long on the CPU (RSA/ECDSA JWTs under heavy
    /// load), which would hold up the other connections of their event
    /// loop.
    #[arg(long, requires = "config")]
    work_stealing: bool,
}

/// Every environment variable the binary reads, for `--help`.
const ENVIRONMENT: &str = "\
Environment:
  NOREPEAT_GATEWAY_TOKEN_SECRET  the token secret (at least 32 bytes) when the file has no token_secret
  RUST_LOG                       log filter (default: info), e.g. norepeat_gateway=debug
  NOREPEAT_LOG_FORMAT            `json` for one JSON object per log line on stderr
  NO_COLOR                       no ANSI colours in the logs (never used when stderr is not a terminal)
  the file's admin.token_env     the admin token, sent as Norepeat-Admin-Token (its name is the file's to choose)
  the file's identity.jwt.secret_env   an HS256 identity's secret (its name is the file's to choose)";

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
    // `SIGHUP`'s, `SIGUSR1`'s and `SIGUSR2`'s default action ends the
    // process: taken over first, so a reload (or logrotate's reopen) asked
    // while the file is still being read (or the store reached) is no
    // kill. The handlers are the process's from here on (the runtime that
    // serves registers its own listeners on them later).
    #[cfg(unix)]
    hold_signals();
    let cli = Cli::parse();
    match (cli.command, cli.config) {
        (Some(Command::Check { file }), _) => match Config::load(&file) {
            Ok(config) => {
                println!("ok: {} routes", config.routes.len());
                ExitCode::SUCCESS
            }
            Err(problems) => {
                eprint!("{problems}");
                ExitCode::from(2)
            }
        },
        (None, Some(file)) => match Config::load(&file) {
            Ok(config) => {
                let workers = cli.workers.map_or_else(
                    || std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
                    std::num::NonZeroUsize::get,
                );
                let mode = if cli.work_stealing {
                    Mode::WorkStealing(workers)
                } else {
                    Mode::PerCore(workers)
                };
                run(&config, cli.listen, file, mode)
            }
            Err(problems) => {
                eprint!("{problems}");
                ExitCode::from(2)
            }
        },
        (None, None) => {
            eprintln!("norepeat-gateway: give --config FILE to serve, or check FILE (see --help)");
            ExitCode::from(2)
        }
    }
}

/// Installs handlers for `SIGHUP`, `SIGUSR1` and `SIGUSR2` (a runtime of
/// its own, for the moment it takes): until the serving runtime listens for
/// them, each is noted and does nothing.
#[cfg(unix)]
fn hold_signals() {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
    else {
        return;
    };
    rt.block_on(async {
        for kind in [
            SignalKind::hangup(),
            SignalKind::user_defined1(),
            SignalKind::user_defined2(),
        ] {
            let _ = signal(kind);
        }
    });
}

/// Logs on stderr (`RUST_LOG`, default `info`; one JSON object a line
/// with `NOREPEAT_LOG_FORMAT=json`).
fn logs() {
    use tracing_subscriber::util::SubscriberInitExt;
    let json = std::env::var("NOREPEAT_LOG_FORMAT").is_ok_and(|f| f == "json");
    // Colours only for a person at a terminal: a log file or a
    // collector gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let directives = std::env::var("RUST_LOG").unwrap_or_default();
    // A warning repeated per request (a store that is down) is written
    // once a place per 10 s, the rest counted.
    let throttle = norepeat_gateway::throttle::Throttle::default();
    throttle.report_every_interval();
    norepeat_gateway::throttle::subscriber(&directives, json, ansi, throttle).init();
}

/// How the process serves.
#[derive(Clone, Copy)]
enum Mode {
    /// One single-threaded event loop per worker, each with its socket.
    PerCore(usize),
    /// tokio's work-stealing runtime with this many threads, one socket.
    WorkStealing(usize),
}

fn run(config: &Config, listen: Option<SocketAddr>, file: PathBuf, mode: Mode) -> ExitCode {
    let runtime = match mode {
        // The main thread is the first worker.
        Mode::PerCore(_) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        Mode::WorkStealing(n) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
    };
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => {
            eprintln!("norepeat-gateway: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    logs();
    if config.store.as_url().is_none() {
        tracing::warn!(
            "store: memory: idempotency records, fingerprints and tokens live in this process only; they do not survive a restart and do not reach a second instance (use redis:// for more than one instance)"
        );
    }
    let result = runtime.block_on(async {
        let metrics = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full("norepeat_gateway_upstream_seconds".into()),
                &[
                    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                ],
            )
            .and_then(PrometheusBuilder::install_recorder)
            .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
        let addr = listen.unwrap_or(config.listen);
        let cannot_listen = |e: std::io::Error| format!("cannot listen on {addr}: {e}");
        // Bound before the gateway is built: its upstream pools are made
        // one per worker.
        let listening = match mode {
            Mode::PerCore(n) => Listening::Workers(Workers::bind(addr, n).map_err(cannot_listen)?),
            Mode::WorkStealing(_) => Listening::One(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(cannot_listen)?,
            ),
        };
        let local = match &listening {
            Listening::Workers(w) => w.local_addr(),
            Listening::One(l) => l.local_addr(),
        }
        .map_err(|e| e.to_string())?;
        let gateway = Gateway::build(config, Some(metrics))
            .await
            .map_err(|e| e.to_string())?;
        // The admin listener too, before saying we listen: a probe sent
        // on that line's word finds it.
        gateway.listen_admin().map_err(|e| e.to_string())?;
        // `SIGHUP` asks for a reload: take it over before saying we listen
        // (its default action ends the process), not when the file watcher
        // first runs. The handler stays for the life of the process.
        #[cfg(unix)]
        let _hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .map_err(|e| format!("cannot handle SIGHUP: {e}"))?;
        // `SIGTERM` likewise: one the moment after the line below drains.
        norepeat_gateway::serve::arm_stop_signal()
            .map_err(|e| format!("cannot handle SIGTERM: {e}"))?;
        {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let scheme = if config.tls.is_some() {
                "https"
            } else {
                "http"
            };
            let _ = writeln!(out, "listening on {scheme}://{local}");
            let _ = out.flush();
        }
        match listening {
            Listening::Workers(workers) => serve_workers(gateway, workers, Some(file)).await,
            Listening::One(listener) => serve(gateway, listener, Some(file)).await,
        }
        .map_err(|e| e.to_string())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("norepeat-gateway: {e}");
            ExitCode::FAILURE
        }
    }
}

enum Listening {
    Workers(Workers),
    One(tokio::net::TcpListener),
}
