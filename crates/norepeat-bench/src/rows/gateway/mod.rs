//! The `gateway.*` rows: one trivial backend (an axum server in this
//! process answering `GET` with 200 and anything else with 201, a small
//! fixed body), loaded directly, through a `norepeat-gateway` process, and
//! through the anchors it is held against, each given what the gateway is
//! given: the same backend, the same Redis, as many worker processes or
//! threads as the gateway has workers (one a core).
//!
//! The rows without `inproc` load it as users do with `wrk -t2 -c64`: a
//! load generator in a process of its own (this bench started again, see
//! `load`), 64 keep-alive connections (`--concurrency`), 2 threads. In
//! the order they run, each beside its anchor:
//!
//! | row | request | through |
//! |---|---|---|
//! | `direct` | `GET /orders` | nothing: the backend itself |
//! | `nginx` | `GET` | NGINX `proxy_pass` (upstream `keepalive`) |
//! | `passthrough` | `GET` | a gateway whose file guards another route only |
//! | `before.passthrough` | `GET` | the same, on `--gateway-before`'s build |
//! | `nginx_post` | `POST`, a body never sent before | NGINX `proxy_pass` |
//! | `nginx_lua` | the same | NGINX with the fingerprint guard written in Lua (`nginx`), `SET NX PX` on the same Redis |
//! | `guarded` | the same | a gateway guarding `POST /orders` by fingerprint (window 3 s, identity `X-User-Id`) |
//! | `before.guarded` | the same | on `--gateway-before`'s build |
//! | `idempotent_proxy` | `POST`, an `Idempotency-Key` never sent before | `idempotent-proxy-server` 1.2.2 on the same Redis (`idempotent_proxy`) |
//! | `idempotency` | the same | a gateway guarding `POST /orders` by idempotency (claim, forward, store the answer) |
//! | `before.idempotency` | the same | on `--gateway-before`'s build |
//! | `idempotent_proxy_replay` | `POST`, one completed key a connection | `idempotent-proxy-server`: each answered from its record |
//! | `replay` | the same | the idempotency gateway: each answered from its record |
//!
//! Beside each figure, the CPU time per request of each process, from
//! `/proc` (see `cpu`), warm-up included on every side: `cpu_us_per_op`
//! the proxy's (its process and its children: NGINX's master and
//! workers), `backend_cpu_us_per_op` this process's (it serves the
//! backend), `store_cpu_us_per_op` the Redis server's (when it runs on
//! this machine), `loader_cpu_us_per_op` the load generator's (over the
//! measured window), and `machine_cpu_us_per_op` every core's busy time
//! (all of them and anything else running).
//!
//! The `gateway.inproc.*` rows are the earlier measure, kept to compare:
//! `POST /orders` driven from this process by the `http.*` rows' load
//! generator and client (one keep-alive reqwest client, a unique body
//! each), directly, through the unguarded and the fingerprint gateway, and
//! through nginx; their `cpu_us_per_op` is this process's (load, client and
//! backend), and the proxy's is noted on stderr.
//!
//! A row whose program is missing is left out with a line on stderr
//! saying how to get it (see [`Programs`]).

mod cpu;
pub(crate) use cpu::process_cpu;
mod idempotent_proxy;
mod inproc;
mod lua;
mod nginx;

use super::super::error::BenchError;
use super::super::harness::{Load, Sample};
use super::RowCtx;
use crate::load::{self, Fresh, Spec};
use axum::Router;
use bytes::Bytes;
use cpu::{Clocks, with_cpu};
use http::{Method, StatusCode};
use idempotent_proxy::IdempotentProxy;
use inproc::{drive, note_cpu};
use lua::LuaGuard;
use nginx::Nginx;
use norepeat_testkit::{GatewayProcess, gateway_binary};
use std::path::PathBuf;

/// The backend's answer.
const ANSWER: &str = r#"{"created":true}"#;

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

/// The programs the gateway rows run, from the bench's flags (or their
/// environment variables); `None` where not named, then looked for as
/// each row says.
#[derive(Debug, Clone, Default)]
pub(crate) struct Programs {
    /// `--gateway`: else `norepeat-gateway` next to this executable.
    pub(crate) gateway: Option<PathBuf>,
    /// `--gateway-before`: the `gateway.before.*` rows run only with it.
    pub(crate) gateway_before: Option<PathBuf>,
    /// `--nginx`: else `nginx` on the `PATH` or in `/usr/sbin`.
    pub(crate) nginx: Option<PathBuf>,
    /// `--idempotent-proxy`: else `idempotent-proxy-server` on the `PATH`.
    pub(crate) idempotent_proxy: Option<PathBuf>,
}

impl Programs {
    /// `idempotent-proxy-server` as named, else on the `PATH`.
    fn idempotent_proxy(&self) -> Option<PathBuf> {
        if let Some(p) = &self.idempotent_proxy {
            return Some(p.clone()).filter(|p| p.is_file());
        }
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .map(|d| d.join("idempotent-proxy-server"))
            .find(|p| p.is_file())
    }
}

/// Which build of the gateway a row runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Build {
    /// `--gateway`, or the one next to this executable.
    Current,
    /// `--gateway-before`.
    Before,
}

/// What stands between the load and the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proxy {
    None,
    Nginx,
    /// NGINX with the fingerprint guard in Lua.
    NginxLua,
    IdempotentProxyServer,
    /// A gateway whose file guards `POST` of this path this way.
    Gateway(&'static str, &'static str, Build),
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
    use Build::{Before, Current};
    use Fresh::{Body, Key, Nothing, Replay};
    let gw = |(p, g): (&'static str, &'static str), b| Proxy::Gateway(p, g, b);
    let by = Driver::Process;
    Some(match name {
        "gateway.direct" => (Proxy::None, by(Nothing)),
        "gateway.nginx" => (Proxy::Nginx, by(Nothing)),
        "gateway.passthrough" => (gw(ELSEWHERE, Current), by(Nothing)),
        "gateway.before.passthrough" => (gw(ELSEWHERE, Before), by(Nothing)),
        "gateway.nginx_post" => (Proxy::Nginx, by(Body)),
        "gateway.nginx_lua" => (Proxy::NginxLua, by(Body)),
        "gateway.guarded" => (gw(FINGERPRINT, Current), by(Body)),
        "gateway.before.guarded" => (gw(FINGERPRINT, Before), by(Body)),
        "gateway.idempotent_proxy" => (Proxy::IdempotentProxyServer, by(Key)),
        "gateway.idempotency" => (gw(IDEMPOTENCY, Current), by(Key)),
        "gateway.before.idempotency" => (gw(IDEMPOTENCY, Before), by(Key)),
        "gateway.idempotent_proxy_replay" => (Proxy::IdempotentProxyServer, by(Replay)),
        "gateway.replay" => (gw(IDEMPOTENCY, Current), by(Replay)),
        "gateway.inproc.direct" => (Proxy::None, Driver::InProcess),
        "gateway.inproc.passthrough" => (gw(ELSEWHERE, Current), Driver::InProcess),
        "gateway.inproc.guarded" => (gw(FINGERPRINT, Current), Driver::InProcess),
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
    let result = match start(name, proxy, &backend, cx).await {
        Ok(Some(running)) => measured(name, proxy, driver, running, cx, load, run).await,
        Ok(None) => Ok(None),
        Err(e) => Err(e),
    };
    server.abort();
    result
}

/// The proxy of a row, stopped once measured.
enum Running {
    None(String),
    Nginx(Nginx),
    IdempotentProxy(IdempotentProxy),
    Gateway(GatewayProcess),
}

impl Running {
    fn base_url(&self) -> &str {
        match self {
            Self::None(b) => b,
            Self::Nginx(n) => &n.base_url,
            Self::IdempotentProxy(p) => &p.base_url,
            Self::Gateway(g) => &g.base_url,
        }
    }

    /// The proxy's process id.
    fn pid(&self) -> Option<u32> {
        match self {
            Self::None(_) => None,
            Self::Nginx(n) => n.pid(),
            Self::IdempotentProxy(p) => p.pid(),
            Self::Gateway(g) => g.pid(),
        }
    }

    async fn stop(self) {
        match self {
            Self::Gateway(gw) => gw.stop().await,
            Self::Nginx(n) => drop(n),
            Self::IdempotentProxy(p) => drop(p),
            Self::None(_) => {}
        }
    }
}

/// Starts the proxy of row `name` in front of `backend`; `None`, with a
/// line on stderr saying how to get it, when its program is missing.
async fn start(
    name: &'static str,
    proxy: Proxy,
    backend: &str,
    cx: &RowCtx<'_>,
) -> Result<Option<Running>, BenchError> {
    let left_out = |why: String| {
        eprintln!("bench: {name} left out: {why}");
        Ok(None)
    };
    let programs = cx.programs;
    Ok(Some(match proxy {
        Proxy::None => Running::None(backend.to_owned()),
        Proxy::Nginx | Proxy::NginxLua => {
            let Some(bin) = nginx::binary(programs.nginx.as_deref()) else {
                return left_out(format!(
                    "no nginx (--nginx PATH or NOREPEAT_NGINX_BIN, else on the PATH or in /usr/sbin); install it: {}",
                    if proxy == Proxy::Nginx {
                        "apt-get install nginx"
                    } else {
                        lua::LUA_INSTALL
                    }
                ));
            };
            let guard = if proxy == Proxy::NginxLua {
                let Some(url) = cx.url else {
                    return left_out("its Lua guard keeps its keys in Redis: give --redis".into());
                };
                match LuaGuard::find(url) {
                    Ok(g) => Some(g),
                    Err(why) => return left_out(why),
                }
            } else {
                None
            };
            Running::Nginx(Nginx::start(&bin, backend, guard.as_ref()).await?)
        }
        Proxy::IdempotentProxyServer => {
            let Some(bin) = programs.idempotent_proxy() else {
                return left_out(format!(
                    "no idempotent-proxy-server (--idempotent-proxy PATH or NOREPEAT_IDEMPOTENT_PROXY_BIN, else on the PATH); get it: {}",
                    idempotent_proxy::INSTALL
                ));
            };
            Running::IdempotentProxy(IdempotentProxy::start(&bin, backend, cx.url).await?)
        }
        Proxy::Gateway(path, guard, build) => {
            let bin = match (build, &programs.gateway, &programs.gateway_before) {
                (Build::Before, _, Some(b)) => b.clone(),
                // Asked for by name only: no line when it is not.
                (Build::Before, _, None) => return Ok(None),
                (Build::Current, Some(b), _) => b.clone(),
                (Build::Current, None, _) => match gateway_binary() {
                    Ok(b) => b,
                    Err(e) => return left_out(e),
                },
            };
            let store = cx.url.unwrap_or("memory");
            let file = format!(
                "upstream: {backend}\nstore: {store}\nidentity:\n  header: X-User-Id\nroutes:\n  - match: POST {path}\n    {guard}\n"
            );
            let gw = GatewayProcess::start(&bin, &file)
                .await
                .map_err(|e| BenchError::unexpected(name, e))?;
            Running::Gateway(gw)
        }
    }))
}

async fn measured(
    name: &'static str,
    proxy: Proxy,
    driver: Driver,
    running: Running,
    cx: &RowCtx<'_>,
    load: &Load,
    run: u64,
) -> Result<Option<Sample>, BenchError> {
    let base = running.base_url().to_owned();
    let me = Some(std::process::id());
    // The store's CPU, where it runs here (whoever calls it).
    let store = match cx.url {
        Some(url) => crate::redis_info::local_server_pid(url).await,
        None => None,
    };
    let sample = match driver {
        Driver::InProcess => {
            let clocks = Clocks {
                proxy: running.pid().or(me),
                store: None,
                backend: None,
            };
            let (sample, spent) = with_cpu(&clocks, drive(name, &base, load, run)).await;
            if proxy != Proxy::None {
                note_cpu(name, spent.proxy, &sample);
            }
            sample
        }
        Driver::Process(fresh) => {
            let spec = Spec {
                addr: base.trim_start_matches("http://").to_owned(),
                path: if proxy == Proxy::IdempotentProxyServer {
                    idempotent_proxy::PATH.to_owned()
                } else {
                    "/orders".to_owned()
                },
                fresh,
                status: if fresh == Fresh::Nothing { 200 } else { 201 },
                answer: ANSWER.to_owned(),
                connections: load.concurrency,
                threads: LOAD_THREADS,
                warmup_ms: u64::try_from(load.warmup.as_millis()).unwrap_or(u64::MAX),
                duration_ms: u64::try_from(load.duration.as_millis()).unwrap_or(u64::MAX),
                run,
            };
            let clocks = Clocks {
                proxy: running.pid(),
                store,
                backend: me,
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
                if let Some(cpu) = per.proxy {
                    eprintln!(
                        "bench: {name}: the proxy process used {cpu:.1} µs of CPU per request"
                    );
                }
                if let Some(store) = per.store {
                    eprintln!("bench: {name}: the Redis server used {store:.1} µs per request");
                }
                m.sample(per)
            })
        }
    };
    running.stop().await;
    sample.map(Some)
}
