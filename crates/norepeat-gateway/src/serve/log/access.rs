//! The access log (`access_log: stdout | stderr | FILE | off`): one JSON
//! line per request, and the request id every request carries.

use crate::config::AccessLog;
use crate::serve::log::metrics::RouteMetrics;
use http::{HeaderMap, HeaderName, HeaderValue};
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// The header that names a request, forwarded to the backend and given
/// back to the client: the client's (or its proxy's) when it sent a
/// usable one, else one the gateway makes.
pub(crate) const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// How long the upstream took for one request: told by the upstream
/// phase, read by the log phase. It travels in the request's extensions
/// (an `Arc`, put there by `dispatch` when there is an access log), the
/// context the phases share: no task-local, no header.
#[derive(Debug, Default)]
pub(crate) struct UpstreamTime(AtomicU64);

impl UpstreamTime {
    /// Notes `took` in the request's context, if it has one.
    pub(crate) fn note(extensions: Option<&Arc<Self>>, took: Duration) {
        if let Some(t) = extensions {
            // Microseconds, plus one: 0 is "no upstream call".
            let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX - 1);
            t.0.store(us.saturating_add(1), Ordering::Relaxed);
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

/// The request's id: the one it carries when it comes from a trusted
/// proxy (`trusted`) and is 1 to 200 visible ASCII characters, else a
/// fresh one ([`fresh_id`]), put in `headers` so the backend sees it.
pub(crate) fn request_id(headers: &mut HeaderMap, trusted: bool) -> HeaderValue {
    let given = headers.get_all(&REQUEST_ID);
    let count = given.iter().count();
    if let Some(v) = given.iter().next()
        && keeps_given_id(v.as_bytes(), count, trusted)
    {
        return v.clone();
    }
    let id = fresh_id_value();
    headers.insert(REQUEST_ID, id.clone());
    id
}

/// A [`fresh_id`] as a header value.
pub(crate) fn fresh_id_value() -> HeaderValue {
    // Hex digits: always a valid value.
    HeaderValue::from_bytes(&fresh_id()).unwrap_or(HeaderValue::from_static("0"))
}

/// Whether the request id a request carries (`given`, the first of
/// `count`) is kept: it came from a trusted proxy, alone, 1 to 200
/// visible ASCII characters.
pub(crate) fn keeps_given_id(given: &[u8], count: usize, trusted: bool) -> bool {
    trusted && count == 1 && norepeat::identity::is_visible_ascii(given, 200)
}

/// A request id unique in this process and, with 64 random bits per
/// process, across processes: the process's random prefix and a counter,
/// 32 hex digits. No system call per request (a random id each was a
/// `getrandom` per request on the pass-through's hot path).
pub(crate) fn fresh_id() -> [u8; 32] {
    static PREFIX: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(|| {
        let mut raw = [0u8; 8];
        // No randomness (never seen on Linux): the process id and the
        // time still tell processes apart.
        if getrandom::fill(&mut raw).is_err() {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            return u64::from(std::process::id()) << 32 ^ (t as u64);
        }
        u64::from_le_bytes(raw)
    });
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // Not `format!`: its machinery cost more than the rest of the id.
    let mut raw = [0u8; 16];
    raw[..8].copy_from_slice(&prefix.to_be_bytes());
    raw[8..].copy_from_slice(&n.to_be_bytes());
    let mut id = [0u8; 32];
    let _ = hex::encode_to_slice(raw, &mut id);
    id
}

/// Where the lines go.
#[derive(Debug)]
pub(crate) enum Sink {
    Stdout,
    Stderr,
    File(Mutex<std::fs::File>),
}

impl Sink {
    /// The file's `access_log`, opened (a file appended to, created if
    /// missing); `None` for `off`.
    ///
    /// # Errors
    /// The file cannot be opened.
    pub(crate) fn open(log: &AccessLog) -> std::io::Result<Option<Self>> {
        Ok(Some(match log {
            AccessLog::Stdout => Self::Stdout,
            AccessLog::Stderr => Self::Stderr,
            AccessLog::File(path) => Self::File(Mutex::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            )),
            _ => return Ok(None),
        }))
    }

    /// Writes one line: whole, never interleaved with another (one
    /// `write` of the line under the sink's lock).
    pub(crate) fn write(&self, entry: &Entry<'_>) {
        let mut line = entry.to_json().to_string();
        line.push('\n');
        let written = match self {
            Self::Stdout => std::io::stdout().lock().write_all(line.as_bytes()),
            Self::Stderr => std::io::stderr().lock().write_all(line.as_bytes()),
            Self::File(f) => f
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .write_all(line.as_bytes()),
        };
        if let Err(e) = written {
            tracing::warn!(error = %e, "the access log cannot be written");
        }
    }
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
        }
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
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_usable_request_id_is_kept_and_any_other_replaced() {
        let mut h = HeaderMap::new();
        h.insert(REQUEST_ID, HeaderValue::from_static("abc-123"));
        assert_eq!(request_id(&mut h, true), "abc-123");
        let mut untrusted = h.clone();
        assert_ne!(
            request_id(&mut untrusted, false),
            "abc-123",
            "a client's own is replaced"
        );
        for bad in ["", "has space", &"x".repeat(201)] {
            let mut h = HeaderMap::new();
            h.insert(REQUEST_ID, HeaderValue::from_str(bad).unwrap());
            let id = request_id(&mut h, true);
            assert_eq!(id.len(), 32, "{bad:?}");
            assert_eq!(h[&REQUEST_ID], id, "the backend sees the new one");
        }
        let (a, b) = (fresh_id(), fresh_id());
        assert_ne!(a, b);
        assert_eq!(a[..16], b[..16], "one process, one prefix");
        let mut two = HeaderMap::new();
        two.append(REQUEST_ID, HeaderValue::from_static("a"));
        two.append(REQUEST_ID, HeaderValue::from_static("b"));
        assert_eq!(request_id(&mut two, true).len(), 32);
        assert_eq!(two.get_all(&REQUEST_ID).iter().count(), 1);
    }

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
        };
        let v = e.to_json();
        assert_eq!(v["route"], "POST /payments");
        assert_eq!(v["upstream_ms"], 1.5);
        assert_eq!(v["duration_ms"], 2.0);
        assert!(v["time"].as_str().unwrap().ends_with('Z'), "{v}");
    }
}
