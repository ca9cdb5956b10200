//! The load generator in a process of its own, for the `gateway.*` rows:
//! the bench starts itself again (`norepeat bench --load-generator SPEC`,
//! or `norepeat-bench --load-generator SPEC`) and reads one JSON line back.
//!
//! It loads a proxy the way users measure one (`wrk -t2 -c64`): its own
//! process, its own runtime of [`Spec::threads`] threads, one keep-alive
//! HTTP/1.1 connection per [`Spec::connections`] (a hyper connection each,
//! requests one after the other on it), and, on the POST rows, a body or an
//! `Idempotency-Key` never sent before. The proxy and the backend do not
//! share a scheduler, an allocator or a CPU budget with the load.

use super::error::BenchError;
use super::harness::{PerRequest, Sample, cpu_time, percentile};
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a request carries that no request before it carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Fresh {
    /// Nothing: `GET`, the same request each time.
    Nothing,
    /// `POST` with a JSON body unique to the request.
    Body,
    /// `POST` with an `Idempotency-Key` unique to the request (and a unique
    /// body).
    Key,
    /// `POST` with one `Idempotency-Key` (and one body) per connection:
    /// its first request (in the warm-up) completes the key, every other
    /// one is answered from its record.
    Replay,
}

/// One load: what to send where, how hard and how long.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Spec {
    /// `host:port` of the proxy (or the backend).
    pub(crate) addr: String,
    /// The path requested.
    pub(crate) path: String,
    pub(crate) fresh: Fresh,
    /// The status every answer must have.
    pub(crate) status: u16,
    /// The body every answer must have.
    pub(crate) answer: String,
    pub(crate) connections: usize,
    pub(crate) threads: usize,
    pub(crate) warmup_ms: u64,
    pub(crate) duration_ms: u64,
    /// Random per run: bodies and keys of one run never meet another's.
    pub(crate) run: u64,
}

/// What the load generator prints: the measured window, and every request
/// it sent (warm-up included) to share the proxy's CPU time among.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Measured {
    pub(crate) ops: u64,
    pub(crate) ops_per_s: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) requests: u64,
    /// The load generator's own CPU time per measured request.
    pub(crate) loader_cpu_us_per_op: Option<f64>,
    /// Answers other than the expected one (not counted in `ops`), as
    /// `wrk` counts its non-2xx answers, and the first of them.
    pub(crate) unexpected: u64,
    pub(crate) first_unexpected: Option<String>,
}

/// How to start this bench again: the running executable and the
/// arguments naming the bench command before its flags.
#[derive(Debug, Clone)]
pub struct SelfCommand {
    exe: PathBuf,
    prefix: Vec<String>,
}

impl SelfCommand {
    /// The running executable, whose bench command is named by `prefix`
    /// (`["bench"]` for `norepeat bench`, none for `norepeat-bench`).
    ///
    /// # Errors
    /// When the running executable cannot be found.
    ///
    /// ```
    /// let me = norepeat_bench::SelfCommand::current(&["bench"]).unwrap();
    /// # let _ = me;
    /// ```
    pub fn current(prefix: &[&str]) -> Result<Self, BenchError> {
        Ok(Self {
            exe: std::env::current_exe()?,
            prefix: prefix.iter().map(|&p| p.to_owned()).collect(),
        })
    }
}

/// Runs `spec` in a load-generator process and reads what it measured.
pub(crate) async fn drive(
    name: &'static str,
    me: &SelfCommand,
    spec: &Spec,
) -> Result<Measured, BenchError> {
    let spec_json =
        serde_json::to_string(spec).map_err(|e| BenchError::unexpected(name, e.to_string()))?;
    let out = tokio::process::Command::new(&me.exe)
        .args(&me.prefix)
        .args(["--load-generator", &spec_json])
        .env("RUST_LOG", "warn")
        .env_remove("REDIS_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().rev().find(|l| l.starts_with('{'));
    match (out.status.success(), line) {
        (true, Some(l)) => serde_json::from_str(l).map_err(|e| {
            BenchError::unexpected(name, format!("the load generator said {l:?}: {e}"))
        }),
        _ => Err(BenchError::unexpected(
            name,
            format!(
                "the load generator ({} {}) failed ({}): {}",
                me.exe.display(),
                me.prefix.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        )),
    }
}

/// The load generator's side: runs `spec` on a runtime of its own and
/// prints one JSON line of [`Measured`].
pub(crate) async fn serve(spec_json: &str) -> Result<(), BenchError> {
    let spec: Spec = serde_json::from_str(spec_json)
        .map_err(|e| BenchError::unexpected("--load-generator", e.to_string()))?;
    // A plain thread: a runtime cannot be started on one of the caller's.
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(spec.threads.max(1))
            .enable_all()
            .build()?;
        rt.block_on(load(Arc::new(spec)))
    });
    let measured = tokio::task::spawn_blocking(move || thread.join())
        .await?
        .map_err(|_| BenchError::unexpected("--load-generator", "the load thread panicked"))??;
    let line = serde_json::to_string(&measured)
        .map_err(|e| BenchError::unexpected("--load-generator", e.to_string()))?;
    println!("{line}");
    Ok(())
}

/// What one connection measured.
struct Connection {
    /// Latencies of the expected answers in the measured window.
    lat: Vec<u32>,
    /// Requests sent, warm-up included.
    sent: u64,
    /// When the last measured answer came.
    last: Instant,
    unexpected: u64,
    first_unexpected: Option<String>,
}

async fn load(spec: Arc<Spec>) -> Result<Measured, BenchError> {
    let start = Instant::now() + Duration::from_millis(spec.warmup_ms);
    let end = start + Duration::from_millis(spec.duration_ms);
    let cpu_at_start = tokio::spawn(async move {
        tokio::time::sleep_until(start.into()).await;
        cpu_time()
    });
    let mut tasks = Vec::with_capacity(spec.connections);
    for c in 0..spec.connections.max(1) {
        let spec = Arc::clone(&spec);
        tasks.push(tokio::spawn(async move {
            connection(&spec, c, start, end).await
        }));
    }
    let (mut all, mut requests, mut last) = (Vec::new(), 0, start);
    let (mut unexpected, mut first_unexpected) = (0, None);
    for t in tasks {
        let c = t.await??;
        all.extend_from_slice(&c.lat);
        requests += c.sent;
        last = last.max(c.last);
        unexpected += c.unexpected;
        first_unexpected = first_unexpected.or(c.first_unexpected);
    }
    let cpu = cpu_at_start.await?.zip(cpu_time()).map(|(a, b)| b - a);
    if all.is_empty() {
        return match first_unexpected {
            Some(what) => Err(BenchError::unexpected("--load-generator", what)),
            None => Err(BenchError::Empty),
        };
    }
    all.sort_unstable();
    #[allow(clippy::cast_precision_loss)]
    let ops = all.len() as f64;
    Ok(Measured {
        ops: all.len() as u64,
        ops_per_s: ops / (last - start).as_secs_f64().max(1e-9),
        p50_us: percentile(&all, 0.50),
        p99_us: percentile(&all, 0.99),
        requests,
        loader_cpu_us_per_op: cpu.map(|c| c.as_secs_f64() * 1e6 / ops),
        unexpected,
        first_unexpected,
    })
}

/// One keep-alive connection sending requests one after the other until
/// `end`; a request started in the measured window is timed to its answer.
async fn connection(
    spec: &Spec,
    c: usize,
    start: Instant,
    end: Instant,
) -> Result<Connection, BenchError> {
    let row = "--load-generator";
    let stream = tokio::net::TcpStream::connect(&spec.addr).await?;
    stream.set_nodelay(true)?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| BenchError::unexpected(row, format!("handshake: {e}")))?;
    tokio::spawn(conn);
    let status = StatusCode::from_u16(spec.status)
        .map_err(|e| BenchError::unexpected(row, e.to_string()))?;
    let mut out = Connection {
        lat: Vec::with_capacity(16 * 1024),
        sent: 0,
        last: start,
        unexpected: 0,
        first_unexpected: None,
    };
    for i in 0u64.. {
        let req = request(spec, c, i)?;
        let t0 = Instant::now();
        if t0 >= end {
            break;
        }
        send.ready()
            .await
            .map_err(|e| BenchError::unexpected(row, format!("connection: {e}")))?;
        let res = send
            .send_request(req)
            .await
            .map_err(|e| BenchError::unexpected(row, format!("request: {e}")))?;
        let got = res.status();
        let body = res
            .into_body()
            .collect()
            .await
            .map_err(|e| BenchError::unexpected(row, format!("body: {e}")))?
            .to_bytes();
        let t1 = Instant::now();
        out.sent += 1;
        if got != status || body != spec.answer.as_bytes() {
            out.unexpected += 1;
            if out.first_unexpected.is_none() {
                out.first_unexpected = Some(format!(
                    "{} answered {got}: {}",
                    spec.path,
                    String::from_utf8_lossy(&body)
                ));
            }
        } else if t0 >= start {
            out.lat
                .push(u32::try_from((t1 - t0).as_nanos()).unwrap_or(u32::MAX));
            out.last = out.last.max(t1);
        }
    }
    Ok(out)
}

/// Request `i` of connection `c`.
fn request(spec: &Spec, c: usize, i: u64) -> Result<Request<Full<Bytes>>, BenchError> {
    let b = Request::builder()
        .uri(&spec.path)
        .header(http::header::HOST, &spec.addr)
        .header("x-user-id", "bench-user");
    let req = match spec.fresh {
        Fresh::Nothing => b.method(Method::GET).body(Full::new(Bytes::new())),
        Fresh::Body | Fresh::Key | Fresh::Replay => {
            let note = if spec.fresh == Fresh::Replay {
                format!("{:016x}-{c}", spec.run)
            } else {
                format!("{:016x}-{c}-{i}", spec.run)
            };
            let b = b
                .method(Method::POST)
                .header(http::header::CONTENT_TYPE, "application/json");
            let b = if spec.fresh == Fresh::Body {
                b
            } else {
                b.header("idempotency-key", &note)
            };
            b.body(Full::new(Bytes::from(format!(
                r#"{{"sku":"SKU-1","quantity":1,"note":"{note}"}}"#
            ))))
        }
    };
    req.map_err(|e| BenchError::unexpected("--load-generator", e.to_string()))
}

impl Measured {
    /// The row's sample, with the CPU times per request the bench read
    /// (the proxy's, the store's, the backend's, the machine's) and the
    /// load generator's own.
    pub(crate) fn sample(&self, cpu: PerRequest) -> Sample {
        Sample {
            ops_per_s: self.ops_per_s,
            p50_us: self.p50_us,
            p99_us: self.p99_us,
            ops: self.ops,
            cpu_us_per_op: cpu.proxy,
            store_cpu_us_per_op: cpu.store,
            machine_cpu_us_per_op: cpu.machine,
            backend_cpu_us_per_op: cpu.backend,
            loader_cpu_us_per_op: self.loader_cpu_us_per_op,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(fresh: Fresh) -> Spec {
        Spec {
            addr: "127.0.0.1:9".into(),
            path: "/orders".into(),
            fresh,
            status: 201,
            answer: String::new(),
            connections: 1,
            threads: 1,
            warmup_ms: 0,
            duration_ms: 1,
            run: 7,
        }
    }

    #[test]
    fn each_post_is_new_and_each_get_the_same() {
        let get = request(&spec(Fresh::Nothing), 0, 1).unwrap();
        assert_eq!(get.method(), Method::GET);
        let key = |r: &Request<Full<Bytes>>| r.headers().get("idempotency-key").cloned();
        let (a, b) = (
            request(&spec(Fresh::Key), 0, 1).unwrap(),
            request(&spec(Fresh::Key), 1, 1).unwrap(),
        );
        assert!(key(&a).is_some() && key(&a) != key(&b));
        assert!(key(&request(&spec(Fresh::Body), 0, 1).unwrap()).is_none());
    }

    /// A replay row sends one key a connection (its body made of the key): every
    /// request after the first is a replay, not a new key.
    #[test]
    fn a_replay_repeats_its_connections_key_and_body() {
        let key = |r: &Request<Full<Bytes>>| r.headers().get("idempotency-key").cloned();
        let s = spec(Fresh::Replay);
        let (a, b, other) = (
            request(&s, 3, 1).unwrap(),
            request(&s, 3, 2).unwrap(),
            request(&s, 4, 1).unwrap(),
        );
        assert_eq!(a.method(), Method::POST);
        assert!(key(&a).is_some() && key(&a) == key(&b));
        assert_ne!(key(&a), key(&other));
    }
}
