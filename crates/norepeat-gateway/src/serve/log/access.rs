//! The access log (`access_log: stdout | stderr | FILE | off`): one JSON
//! line per request.

use crate::config::AccessLog;
use crate::serve::log::metrics::RouteMetrics;
use crate::serve::log::request_id::fresh_id;
use http::HeaderValue;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// How long the upstream took for one request: told by the upstream
/// phase, read by the log phase. It travels in the request's extensions
/// (an `Arc`, put there by `dispatch` when there is an access log), the
/// context the phases share: no task-local, no header.
#[derive(Debug, Default)]
pub(crate) struct UpstreamTime(AtomicU64, std::sync::atomic::AtomicU16);

impl UpstreamTime {
    /// Notes `took` in the request's context, if it has one.
    pub(crate) fn note(extensions: Option<&Arc<Self>>, took: Duration) {
        if let Some(t) = extensions {
            // Microseconds, plus one: 0 is "no upstream call".
            let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX - 1);
            t.0.store(us.saturating_add(1), Ordering::Relaxed);
        }
    }

    /// Notes the upstream's status in the request's context, if it has one.
    pub(crate) fn note_status(extensions: Option<&Arc<Self>>, status: u16) {
        if let Some(t) = extensions {
            t.1.store(status, Ordering::Relaxed);
        }
    }

    /// The upstream's status, if one answered.
    pub(crate) fn status(&self) -> Option<u16> {
        match self.1.load(Ordering::Relaxed) {
            0 => None,
            s => Some(s),
        }
    }

    /// The upstream's time, if an upstream was called.
    pub(crate) fn get(&self) -> Option<Duration> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            us => Some(Duration::from_micros(us - 1)),
        }
    }
}

/// Where the lines go: a writer thread of its own, fed through a bounded
/// queue, so writing a line never blocks a request (a slow disk, a full
/// pipe). A line that finds the queue full is dropped and counted
/// (`norepeat_gateway_access_log_dropped_total`), never waited for.
#[derive(Debug)]
pub(crate) struct Sink {
    dest: Arc<Dest>,
    queue: std::sync::mpsc::SyncSender<String>,
}

/// The lines a sink holds before it drops one: about 10 MB of them.
const QUEUED: usize = 32 * 1024;

/// Where the writer thread writes.
#[derive(Debug)]
enum Dest {
    Stdout,
    Stderr,
    /// The file's path (opened again on `SIGUSR1`) and the file open now.
    File(std::path::PathBuf, Mutex<std::fs::File>),
}

impl Dest {
    fn write(&self, line: &[u8]) -> std::io::Result<()> {
        match self {
            Self::Stdout => std::io::stdout().lock().write_all(line),
            Self::Stderr => std::io::stderr().lock().write_all(line),
            Self::File(_, f) => f
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .write_all(line),
        }
    }
}

impl Sink {
    /// The file's `access_log`, opened (a file appended to, created if
    /// missing) and its writer thread started; `None` for `off`.
    ///
    /// # Errors
    /// The file cannot be opened, or the thread cannot be started.
    pub(crate) fn open(log: &AccessLog) -> std::io::Result<Option<Self>> {
        let dest = Arc::new(match log {
            AccessLog::Stdout => Dest::Stdout,
            AccessLog::Stderr => Dest::Stderr,
            AccessLog::File(path) => Dest::File(path.clone(), Mutex::new(append_to(path)?)),
            _ => return Ok(None),
        });
        let (queue, lines) = std::sync::mpsc::sync_channel::<String>(QUEUED);
        let writer = Arc::clone(&dest);
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || {
                // Ends when the sink (the gateway) is dropped.
                for line in lines {
                    if let Err(e) = writer.write(line.as_bytes()) {
                        tracing::warn!(error = %e, "the access log cannot be written");
                    }
                }
            })?;
        Ok(Some(Self { dest, queue }))
    }

    /// Opens the file again at its path (created if it was moved away),
    /// and writes the next lines there. Stdout and stderr have nothing to
    /// open.
    ///
    /// # Errors
    /// The file cannot be opened; the lines go on to the one open before.
    pub(crate) fn reopen(&self) -> std::io::Result<()> {
        if let Dest::File(path, f) = &*self.dest {
            let fresh = append_to(path)?;
            *f.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = fresh;
        }
        Ok(())
    }

    /// Queues one line for the writer thread, which writes it whole (one
    /// `write`), never interleaved with another.
    pub(crate) fn write(&self, entry: &Entry<'_>) {
        let mut line = entry.to_json().to_string();
        line.push('\n');
        if self.queue.try_send(line).is_err() {
            metrics::counter!("norepeat_gateway_access_log_dropped_total").increment(1);
        }
    }
}

/// `path` opened to append, created if missing.
fn append_to(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// An access-log line owed for a request since it came: written when it
/// is answered ([`Owed::answered`]) or, when the client leaves first (the
/// request's future dropped; an idempotency route's upstream call goes on
/// in a task of its own), with status 499 and outcome `client_closed`, as
/// NGINX logs a client that closed its connection (naming the route the
/// request had been given to, if it had: [`Owed::routed_by`]).
pub(crate) struct Owed<'a> {
    sink: &'a Sink,
    request_id: &'a HeaderValue,
    method: http::Method,
    path: String,
    started: std::time::Instant,
    written: bool,
    /// Where the route is put once the request is given to one.
    route: Option<&'a OnceLock<Arc<RouteMetrics>>>,
    /// Who sent it, to which site, and how many body bytes it announced.
    client: Option<std::net::IpAddr>,
    host: Option<String>,
    bytes_in: Option<u64>,
    /// The upstream's status and the answer's length, once known.
    upstream_status: Option<u16>,
    bytes_out: Option<u64>,
}

impl<'a> Owed<'a> {
    pub(crate) fn new(
        sink: &'a Sink,
        request_id: &'a HeaderValue,
        method: &http::Method,
        path: &str,
    ) -> Self {
        Self {
            sink,
            request_id,
            method: method.clone(),
            path: path.to_owned(),
            started: std::time::Instant::now(),
            written: false,
            route: None,
            client: None,
            host: None,
            bytes_in: None,
            upstream_status: None,
            bytes_out: None,
        }
    }

    /// The client's address, the request's site (`Host`, as sent) and its
    /// announced body length.
    pub(crate) fn from(
        mut self,
        client: Option<std::net::IpAddr>,
        host: Option<&[u8]>,
        bytes_in: Option<u64>,
    ) -> Self {
        self.client = client;
        self.host = host.map(|h| String::from_utf8_lossy(h).into_owned());
        self.bytes_in = bytes_in;
        self
    }

    /// The upstream's status (none when no upstream answered) and the
    /// answer's body length (when known).
    pub(crate) fn with_answer(&mut self, upstream_status: Option<u16>, bytes_out: Option<u64>) {
        self.upstream_status = upstream_status;
        self.bytes_out = bytes_out;
    }

    /// The line of a client that leaves names the route set in `route`
    /// by then.
    pub(crate) fn routed_by(mut self, route: &'a OnceLock<Arc<RouteMetrics>>) -> Self {
        self.route = Some(route);
        self
    }

    /// The answered request's line.
    pub(crate) fn answered(
        mut self,
        route: Option<&str>,
        status: u16,
        outcome: &str,
        upstream: Option<Duration>,
    ) {
        self.write(route, status, outcome, upstream);
    }

    fn write(
        &mut self,
        route: Option<&str>,
        status: u16,
        outcome: &str,
        upstream: Option<Duration>,
    ) {
        self.written = true;
        self.sink.write(&Entry {
            request_id: self.request_id.to_str().unwrap_or_default(),
            route,
            method: self.method.as_str(),
            path: &self.path,
            status,
            outcome,
            upstream,
            took: self.started.elapsed(),
            client: self.client,
            host: self.host.as_deref(),
            upstream_status: self.upstream_status,
            bytes_in: self.bytes_in,
            bytes_out: self.bytes_out,
        });
    }
}

impl Drop for Owed<'_> {
    fn drop(&mut self) {
        if !self.written {
            let route = self.route.and_then(OnceLock::get).map(Arc::clone);
            self.write(
                route.as_deref().map(RouteMetrics::label),
                499,
                "client_closed",
                None,
            );
        }
    }
}

/// The line of a request whose head the HTTP parser refused (answered
/// `status` by hyper before any route): no method or path to name.
pub(crate) fn refused_head(sink: &Sink, status: u16) {
    let id = fresh_id();
    sink.write(&Entry {
        request_id: std::str::from_utf8(&id).unwrap_or_default(),
        route: None,
        method: "",
        path: "",
        status,
        outcome: "invalid_request",
        upstream: None,
        took: Duration::ZERO,
        client: None,
        host: None,
        upstream_status: None,
        bytes_in: None,
        bytes_out: None,
    });
}

/// One request, as its line says it.
#[derive(Debug)]
pub(crate) struct Entry<'a> {
    pub(crate) request_id: &'a str,
    /// The route's `match`, `None` for a request no route takes.
    pub(crate) route: Option<&'a str>,
    pub(crate) method: &'a str,
    pub(crate) path: &'a str,
    pub(crate) status: u16,
    /// The contract's outcome; `passthrough` for a request no route takes.
    pub(crate) outcome: &'a str,
    pub(crate) upstream: Option<Duration>,
    pub(crate) took: Duration,
    /// The client's address (the peer, or the one trusted proxies name).
    pub(crate) client: Option<std::net::IpAddr>,
    /// The `Host` as sent.
    pub(crate) host: Option<&'a str>,
    pub(crate) upstream_status: Option<u16>,
    /// The request body's announced length, the answer body's length.
    pub(crate) bytes_in: Option<u64>,
    pub(crate) bytes_out: Option<u64>,
}

impl Entry<'_> {
    fn to_json(&self) -> serde_json::Value {
        use tracing_subscriber::fmt::time::FormatTime;
        let mut time = String::new();
        let _ = tracing_subscriber::fmt::time::SystemTime
            .format_time(&mut tracing_subscriber::fmt::format::Writer::new(&mut time));
        let ms = |d: Duration| (d.as_secs_f64() * 1e6).round() / 1e3;
        serde_json::json!({
            "time": time,
            "request_id": self.request_id,
            "route": self.route,
            // Empty for a head the parser refused: no method, no path.
            "method": (!self.method.is_empty()).then_some(self.method),
            "path": (!self.path.is_empty()).then_some(self.path),
            "status": self.status,
            "outcome": self.outcome,
            "upstream_ms": self.upstream.map(ms),
            "duration_ms": ms(self.took),
            "client": self.client.map(|c| c.to_string()),
            "host": self.host,
            "upstream_status": self.upstream_status,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_names_every_field() {
        let e = Entry {
            request_id: "r1",
            route: Some("POST /payments"),
            method: "POST",
            path: "/payments",
            status: 201,
            outcome: "passed",
            upstream: Some(Duration::from_micros(1500)),
            took: Duration::from_millis(2),
            client: Some(std::net::IpAddr::from([10, 0, 0, 7])),
            host: Some("shop.example"),
            upstream_status: Some(201),
            bytes_in: Some(17),
            bytes_out: Some(64),
        };
        let v = e.to_json();
        assert_eq!(v["route"], "POST /payments");
        assert_eq!(v["upstream_ms"], 1.5);
        assert_eq!(v["duration_ms"], 2.0);
        assert_eq!(v["client"], "10.0.0.7");
        assert_eq!(v["host"], "shop.example");
        assert_eq!(v["upstream_status"], 201);
        assert_eq!(
            (v["bytes_in"].as_u64(), v["bytes_out"].as_u64()),
            (Some(17), Some(64))
        );
        assert!(v["time"].as_str().unwrap().ends_with('Z'), "{v}");
    }
}
