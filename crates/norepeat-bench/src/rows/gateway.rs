// Over 400 lines on purpose: the gateway rows and the processes they drive (the gateway, nginx, the load generator) with the CPU each spends, measured alike.
//! The `gateway.*` rows: one trivial backend (an axum server in this
//! process answering `GET` with 200 and anything else with 201, a small
//! fixed body), loaded directly, through a `norepeat-gateway` process and
//! through Debian's `nginx`.
//!
//! The rows without `inproc` load it as users and issue 39 do: a load
//! generator in a process of its own (this bench started again, see
//! `load`), 64 keep-alive connections (`--concurrency`), 2 threads:
//!
//! - `direct`: `GET /orders` to the backend itself;
//! - `passthrough`: `GET /orders` through a gateway whose file guards
//!   another route only, so the request streams through;
//! - `nginx`: `GET /orders` through nginx's `proxy_pass` (an upstream
//!   block with `keepalive`), `daemon off`, with as many worker processes
//!   as the gateway has workers (one a core: every peer gets the cores
//!   the gateway gets), on a file and prefix of its own;
//! - `nginx_post`: `POST /orders` with a body never sent before, through
//!   nginx (the yardstick of the two guarded rows);
//! - `guarded`: the same `POST` through a gateway guarding `POST /orders`
//!   by fingerprint (window 3 s, identity `X-User-Id`) on the bench's store
//!   (its own memory store, or the `--redis` server): every request new;
//! - `idempotency`: the same `POST` with an `Idempotency-Key` never sent
//!   before, through a gateway guarding `POST /orders` by idempotency
//!   (claim, forward, store the answer).
//!
//! Their `cpu_us_per_op` is the proxy's CPU time per request (its process
//! and its child processes: nginx's master and workers; for
//! `direct`, this process's: the backend), warm-up included on both sides;
//! `machine_cpu_us_per_op` every core's busy time per request (the load
//! generator, the backend, the proxy, Redis and anything else running);
//! and on a Redis of this machine, `store_cpu_us_per_op` the Redis
//! server's CPU time per request (what the one round trip costs the cores
//! the proxy shares with it: issue 39's ceiling, in `report`).
//!
//! The `gateway.inproc.*` rows are the earlier measure, kept to compare:
//! `POST /orders` driven from this process by the `http.*` rows' load
//! generator and client (one keep-alive reqwest client, a unique body
//! each), directly, through the unguarded and the fingerprint gateway, and
//! through nginx; their `cpu_us_per_op` is this process's (load, client and
//! backend), and the proxy's is noted on stderr.
//!
//! A row whose program is missing (`norepeat-gateway` next to this
//! executable or at `NOREPEAT_GATEWAY_BIN`; `nginx` on the `PATH`, in
//! `/usr/sbin` or at `NOREPEAT_NGINX_BIN`) is left out with a note on
//! stderr. Each proxy row also notes on stderr the proxy process's CPU
//! time per request.

use super::super::BenchError;
use super::super::harness::{Load, Sample, measure};
use super::RowCtx;
use crate::load::{self, Fresh, Spec};
use axum::Router;
use bytes::Bytes;
use http::{Method, StatusCode};
use norepeat_testkit::{GatewayProcess, gateway_binary};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

/// The backend's answer.
const ANSWER: &str = r#"{"created":true}"#;

/// The environment variable naming the `nginx` binary.
const NGINX_ENV: &str = "NOREPEAT_NGINX_BIN";

/// How long `nginx` may take to accept connections.
const NGINX_DEADLINE: Duration = Duration::from_secs(10);

/// Threads of the load generator's process (`wrk -t2`).
const LOAD_THREADS: usize = 2;

/// `GET` is read (200), anything else creates (201).
async fn answer(method: Method, _body: Bytes) -> (StatusCode, &'static str) {
    if method == Method::GET {
        (StatusCode::OK, ANSWER)
    } else {
        (StatusCode::CREATED, ANSWER)
    }
}

/// What stands between the load and the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proxy {
    None,
    Nginx,
    /// A gateway whose file guards `POST` of this path this way.
    Gateway(&'static str, &'static str),
}

/// Who sends the requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Driver {
    /// A load-generator process: `GET`, or `POST` with what is new each time.
    Process(Fresh),
    /// The `http.*` rows' load generator in this process (`POST`).
    InProcess,
}

/// The unguarded gateway's route: not the one requested.
const ELSEWHERE: (&str, &str) = ("/elsewhere", "guard: fingerprint\n    window: 3s");
const FINGERPRINT: (&str, &str) = ("/orders", "guard: fingerprint\n    window: 3s");
const IDEMPOTENCY: (&str, &str) = (
    "/orders",
    "guard: idempotency\n    required: true\n    retention: 60s",
);

/// The proxy and the driver of row `name`.
fn plan(name: &str) -> Option<(Proxy, Driver)> {
    let gw = |(p, g): (&'static str, &'static str)| Proxy::Gateway(p, g);
    Some(match name {
        "gateway.direct" => (Proxy::None, Driver::Process(Fresh::Nothing)),
        "gateway.passthrough" => (gw(ELSEWHERE), Driver::Process(Fresh::Nothing)),
        "gateway.nginx" => (Proxy::Nginx, Driver::Process(Fresh::Nothing)),
        "gateway.nginx_post" => (Proxy::Nginx, Driver::Process(Fresh::Body)),
        "gateway.guarded" => (gw(FINGERPRINT), Driver::Process(Fresh::Body)),
        "gateway.idempotency" => (gw(IDEMPOTENCY), Driver::Process(Fresh::Key)),
        "gateway.inproc.direct" => (Proxy::None, Driver::InProcess),
        "gateway.inproc.passthrough" => (gw(ELSEWHERE), Driver::InProcess),
        "gateway.inproc.guarded" => (gw(FINGERPRINT), Driver::InProcess),
        "gateway.inproc.nginx" => (Proxy::Nginx, Driver::InProcess),
        _ => return None,
    })
}

/// Measures the row `name` against a backend of its own; `None` (with a
/// note on stderr) when the program it needs is missing.
pub(crate) async fn row(
    name: &'static str,
    cx: &RowCtx<'_>,
    load: &Load,
    run: u64,
) -> Result<Option<Sample>, BenchError> {
    let Some((proxy, driver)) = plan(name) else {
        return Ok(None);
    };
    let app = Router::new().fallback(answer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let backend = format!("http://{}", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let result = proxied(name, proxy, driver, &backend, cx, load, run).await;
    server.abort();
    result
}

async fn proxied(
    name: &'static str,
    proxy: Proxy,
    driver: Driver,
    backend: &str,
    cx: &RowCtx<'_>,
    load: &Load,
    run: u64,
) -> Result<Option<Sample>, BenchError> {
    let store = cx.url.unwrap_or("memory");
    let (base, pid, running) = match proxy {
        Proxy::None => (backend.to_owned(), Some(std::process::id()), Running::None),
        Proxy::Nginx => {
            let Some(bin) = nginx_binary() else {
                eprintln!(
                    "bench: {name} left out: no nginx (on the PATH, in /usr/sbin or at {NGINX_ENV})"
                );
                return Ok(None);
            };
            let nginx = Nginx::start(&bin, backend).await?;
            (nginx.base_url.clone(), nginx.pid(), Running::Nginx(nginx))
        }
        Proxy::Gateway(path, guard) => {
            let bin = match gateway_binary() {
                Ok(b) => b,
                Err(e) => {
                    eprintln!("bench: {name} left out: {e}");
                    return Ok(None);
                }
            };
            let file = format!(
                "upstream: {backend}\nstore: {store}\nidentity:\n  header: X-User-Id\nroutes:\n  - match: POST {path}\n    {guard}\n"
            );
            let gw = GatewayProcess::start(&bin, &file)
                .await
                .map_err(|e| BenchError::unexpected(name, e))?;
            (gw.base_url.clone(), gw.pid(), Running::Gateway(gw))
        }
    };
    let sample = match driver {
        Driver::InProcess => {
            let clocks = Clocks {
                proxy: pid,
                store: None,
            };
            let (sample, spent) = with_cpu(&clocks, drive(name, &base, load, run)).await;
            let cpu = spent.proxy;
            if proxy != Proxy::None {
                note_cpu(name, cpu, &sample);
            }
            sample
        }
        Driver::Process(fresh) => {
            let spec = Spec {
                addr: base.trim_start_matches("http://").to_owned(),
                path: "/orders".to_owned(),
                fresh,
                status: if fresh == Fresh::Nothing { 200 } else { 201 },
                answer: ANSWER.to_owned(),
                connections: load.concurrency,
                threads: LOAD_THREADS,
                warmup_ms: u64::try_from(load.warmup.as_millis()).unwrap_or(u64::MAX),
                duration_ms: u64::try_from(load.duration.as_millis()).unwrap_or(u64::MAX),
                run,
            };
            // The store's CPU where the gateway calls it and it runs here.
            let store_pid = match (proxy, cx.url) {
                (Proxy::Gateway(..), Some(url)) => crate::redis_info::local_server_pid(url).await,
                _ => None,
            };
            let clocks = Clocks {
                proxy: pid,
                store: store_pid,
            };
            let (measured, spent) = with_cpu(&clocks, load::drive(name, cx.me, &spec)).await;
            measured.map(|m| {
                if let Some(first) = &m.first_unexpected {
                    eprintln!(
                        "bench: {name}: {} of {} answers were not the backend's (left out of ops/s); the first: {first}",
                        m.unexpected, m.requests
                    );
                }
                #[allow(clippy::cast_precision_loss)]
                let per = spent.per(m.requests.max(1) as f64);
                if let (Some(cpu), true) = (per[0], proxy != Proxy::None) {
                    eprintln!(
                        "bench: {name}: the proxy process used {cpu:.1} µs of CPU per request"
                    );
                }
                if let Some(store) = per[1] {
                    eprintln!("bench: {name}: the Redis server used {store:.1} µs per request");
                }
                m.sample(per)
            })
        }
    };
    match running {
        Running::Gateway(gw) => gw.stop().await,
        Running::Nginx(nginx) => drop(nginx),
        Running::None => {}
    }
    sample.map(Some)
}

/// The proxy of a row, stopped once measured.
enum Running {
    None,
    Nginx(Nginx),
    Gateway(GatewayProcess),
}

/// Drives `POST {base}/orders` as the `http.*` rows do.
async fn drive(
    name: &'static str,
    base: &str,
    load: &Load,
    run: u64,
) -> Result<Sample, BenchError> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(load.concurrency)
        .build()?;
    let url: Arc<str> = Arc::from(format!("{base}/orders"));
    let tag = name.len();
    measure(load, move |id| {
        let client = client.clone();
        let url = Arc::clone(&url);
        let body = format!(r#"{{"sku":"SKU-1","quantity":1,"note":"{run:016x}{tag}-{id}"}}"#);
        async move {
            let res = client
                .post(&*url)
                .header("x-user-id", "bench-user")
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await?;
            let status = res.status();
            let bytes = res.bytes().await?;
            if status != reqwest::StatusCode::CREATED || bytes != ANSWER.as_bytes() {
                return Err(BenchError::unexpected(
                    name,
                    format!("answered {status}: {}", String::from_utf8_lossy(&bytes)),
                ));
            }
            Ok(())
        }
    })
    .await
}

/// The processes whose CPU time a row reads.
struct Clocks {
    proxy: Option<u32>,
    store: Option<u32>,
}

/// The CPU time a row's work took: the proxy's, the store's, and every
/// core's busy time.
struct Spent {
    proxy: Option<Duration>,
    store: Option<Duration>,
    machine: Option<Duration>,
}

impl Spent {
    /// Each per request, in microseconds.
    fn per(&self, requests: f64) -> [Option<f64>; 3] {
        [self.proxy, self.store, self.machine].map(|d| d.map(|d| d.as_secs_f64() * 1e6 / requests))
    }
}

/// Runs `work` and the CPU time spent meanwhile.
async fn with_cpu<T>(clocks: &Clocks, work: impl Future<Output = T>) -> (T, Spent) {
    let read = || {
        (
            clocks.proxy.and_then(process_cpu),
            clocks.store.and_then(process_cpu),
            machine_busy(),
        )
    };
    let before = read();
    let out = work.await;
    let after = read();
    let spent =
        |b: Option<Duration>, a: Option<Duration>| b.zip(a).map(|(b, a)| a.saturating_sub(b));
    (
        out,
        Spent {
            proxy: spent(before.0, after.0),
            store: spent(before.1, after.1),
            machine: spent(before.2, after.2),
        },
    )
}

/// Every core's busy time since boot: the first line of `/proc/stat`
/// (`cpu  user nice system idle iowait irq softirq steal ...`, in clock
/// ticks of 10 ms), all but `idle` and `iowait`.
fn machine_busy() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    busy_ticks(stat.lines().next()?).map(|t| Duration::from_millis(t * 10))
}

fn busy_ticks(line: &str) -> Option<u64> {
    let mut fields = line.strip_prefix("cpu ")?.split_whitespace();
    let mut next = || fields.next()?.parse::<u64>().ok();
    let (user, nice, system, _idle, _iowait) = (next()?, next()?, next()?, next()?, next()?);
    let (irq, softirq, steal) = (next()?, next()?, next()?);
    Some(user + nice + system + irq + softirq + steal)
}

/// The proxy's CPU time per request, on stderr (warm-up included).
fn note_cpu(name: &str, cpu: Option<Duration>, sample: &Result<Sample, BenchError>) {
    if let (Some(cpu), Ok(s)) = (cpu, sample) {
        // The warm-up ran at about the measured rate.
        #[allow(clippy::cast_precision_loss)]
        let requests = s.ops as f64 * 1.2;
        eprintln!(
            "bench: {name}: the proxy process used {:.1} µs of CPU per request",
            cpu.as_secs_f64() * 1e6 / requests.max(1.0)
        );
    }
}

/// User + system CPU time of process `pid` (all its threads) and of its
/// child processes (nginx's workers), from `/proc/PID/stat`.
fn process_cpu(pid: u32) -> Option<Duration> {
    let own = one_process_cpu(pid)?;
    let children = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&child| parent_of(child) == Some(pid))
        .filter_map(one_process_cpu)
        .sum::<Duration>();
    Some(own + children)
}

/// The parent process id of `pid` (`/proc/PID/stat`, field 4).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = stat.get(stat.rfind(')')? + 2..)?;
    after_name.split(' ').nth(1)?.parse().ok()
}

/// User + system CPU time of process `pid` alone (all its threads), from
/// `/proc/PID/stat` (fields 14 and 15, counted after the command name,
/// which is in parentheses and may hold spaces), in clock ticks of 10 ms.
fn one_process_cpu(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = after_name.split(' ').collect();
    // After the name: state is field 3, so utime (14) is at index 11.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// `nginx` from `NOREPEAT_NGINX_BIN`, the `PATH`, or `/usr/sbin`.
fn nginx_binary() -> Option<PathBuf> {
    if let Some(v) = std::env::var_os(NGINX_ENV).filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(v)).filter(|p| p.is_file());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|d| d.join("nginx"))
        .find(|p| p.is_file())
}

/// One `nginx` in the foreground on a file and prefix of its own, killed
/// (and its prefix removed) when dropped.
struct Nginx {
    child: Child,
    base_url: String,
    prefix: PathBuf,
}

impl Nginx {
    /// Starts `bin` proxying to `backend` on a free loopback port; returns
    /// once it accepts connections.
    async fn start(bin: &Path, backend: &str) -> Result<Self, BenchError> {
        let prefix = std::env::temp_dir().join(format!(
            "norepeat-nginx-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&prefix)?;
        // A free port, given back for nginx to take (the window is tiny,
        // and a lost race ends in the clear error below).
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let upstream = backend.trim_start_matches("http://");
        // As many workers as the gateway, which runs one a core.
        let workers = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let conf = nginx_conf(&prefix, upstream, port, workers);
        let file = prefix.join("nginx.conf");
        std::fs::write(&file, conf)?;
        let mut cmd = Command::new(bin);
        cmd.arg("-p")
            .arg(&prefix)
            .arg("-c")
            .arg(&file)
            .arg("-e")
            .arg(prefix.join("error.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&prefix);
                return Err(BenchError::unexpected(
                    "gateway.nginx",
                    format!("cannot start {}: {e}", bin.display()),
                ));
            }
        };
        let mut nginx = Self {
            child,
            base_url: format!("http://127.0.0.1:{port}"),
            prefix,
        };
        let deadline = Instant::now() + NGINX_DEADLINE;
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Ok(nginx);
            }
            let exited = nginx.child.try_wait().ok().flatten().is_some();
            if exited || Instant::now() >= deadline {
                let log =
                    std::fs::read_to_string(nginx.prefix.join("error.log")).unwrap_or_default();
                return Err(BenchError::unexpected(
                    "gateway.nginx",
                    format!(
                        "nginx {} on port {port}: {}\n{log}",
                        if exited {
                            "exited"
                        } else {
                            "did not accept connections within 10 s"
                        },
                        nginx.prefix.display()
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // The master ends its workers on SIGTERM (killed, it would leave
        // them running); then `kill_on_drop`'s kill, and its files go with
        // the prefix.
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
            for _ in 0..50 {
                if self.child.try_wait().ok().flatten().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.prefix);
    }
}

/// The file: `workers` worker processes (the gateway's count), no access
/// log, the client's connections and the upstream's kept alive (and not
/// closed after 1000 requests), `Host` and `X-Forwarded-For` passed as the
/// gateway passes them.
fn nginx_conf(prefix: &Path, upstream: &str, port: u16, workers: usize) -> String {
    let p = prefix.display();
    format!(
        r#"daemon off;
master_process on;
worker_processes {workers};
pid {p}/nginx.pid;
error_log {p}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {p}/body;
  proxy_temp_path {p}/proxy;
  fastcgi_temp_path {p}/fastcgi;
  uwsgi_temp_path {p}/uwsgi;
  scgi_temp_path {p}/scgi;
  keepalive_requests 100000000;
  upstream backend {{
    server {upstream};
    keepalive 256;
    keepalive_requests 100000000;
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $http_host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto $scheme;
    }}
  }}
}}
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_time_leaves_idle_and_iowait_out() {
        let line = "cpu  100 2 30 5000 7 1 4 3 0 0";
        assert_eq!(busy_ticks(line), Some(100 + 2 + 30 + 1 + 4 + 3));
        assert_eq!(busy_ticks("cpu0 1 2 3 4 5 6 7 8"), None);
        assert_eq!(busy_ticks("cpu  1 2"), None);
        assert!(machine_busy().is_some_and(|d| d > Duration::ZERO));
    }

    #[test]
    fn cpu_time_is_read_after_the_command_name() {
        let me = process_cpu(std::process::id());
        if Path::new("/proc/self/stat").exists() {
            assert!(me.is_some());
        }
        assert_eq!(process_cpu(u32::MAX), None);
    }

    #[test]
    fn the_nginx_file_keeps_connections_to_the_backend() {
        let conf = nginx_conf(Path::new("/tmp/x"), "127.0.0.1:9", 80, 2);
        assert!(conf.contains("worker_processes 2;"), "{conf}");
        assert!(conf.contains("server 127.0.0.1:9;"), "{conf}");
        assert!(conf.contains("keepalive 256;"), "{conf}");
        assert!(conf.contains("proxy_set_header Connection \"\";"), "{conf}");
        assert!(conf.contains("listen 127.0.0.1:80;"), "{conf}");
    }
}
