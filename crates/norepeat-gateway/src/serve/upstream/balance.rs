//! Several servers behind one upstream (`upstream: [http://a, http://b]`):
//! which one a request goes to, and which are out.
//!
//! A request goes to the server with the fewest requests outstanding
//! (from the pick to its answer's end; ties in turn), among those that
//! are up. A server is out for
//! [`REFUSED_FOR`] after it refused a connection (passive health), and,
//! with `health_check`, from a failed check until one passes. When every
//! server is out, they are tried anyway, as NGINX does, rather than
//! refused. A request is tried on a server at most once, and moves on to
//! the next only when nothing of it reached the last.
//!
//! A server's state is one for the whole process (every route and worker
//! whose upstream names it shares it, by URL), so its count of requests
//! outstanding is all of them.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

/// How long a server that refused a connection takes no requests.
pub(crate) const REFUSED_FOR: Duration = Duration::from_secs(10);

/// The longest a health check waits for its answer.
const MAX_CHECK: Duration = Duration::from_secs(2);

/// One health check of a server: whether it answered 2xx within the time.
pub(crate) type Probe =
    Arc<dyn Fn(Duration) -> Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>;

/// The file's `health_check` (path, interval), for every server state made
/// from now on.
static CHECK: Mutex<Option<crate::config::HealthCheck>> = Mutex::new(None);

/// Every server's state still in use, by URL.
static SERVERS: Mutex<Vec<Weak<Health>>> = Mutex::new(Vec::new());

/// Checks every server made from now on as `check` says (`None`: no
/// checks).
pub(crate) fn use_health_check(check: Option<&crate::config::HealthCheck>) {
    *CHECK.lock().unwrap_or_else(PoisonError::into_inner) = check.cloned();
}

/// One server's state: its requests outstanding, and whether it is out.
#[derive(Debug)]
pub(crate) struct Health {
    url: Box<str>,
    outstanding: AtomicUsize,
    /// Since it refused a connection, when it may take requests again;
    /// kept past then until a request reaches it (to log it back).
    refused_until: Mutex<Option<Instant>>,
    /// Its last health check failed.
    failing: AtomicBool,
}

/// The state of the server at `url` (the one in use, else a new one,
/// checked from a task of its own when the file has a `health_check`,
/// by `probe(path)`).
pub(crate) fn health(url: &str, probe: impl FnOnce(&str) -> Probe) -> Arc<Health> {
    let mut servers = SERVERS.lock().unwrap_or_else(PoisonError::into_inner);
    servers.retain(|w| w.strong_count() > 0);
    if let Some(h) = servers
        .iter()
        .filter_map(Weak::upgrade)
        .find(|h| &*h.url == url)
    {
        return h;
    }
    let h = Arc::new(Health {
        url: url.into(),
        outstanding: AtomicUsize::new(0),
        refused_until: Mutex::new(None),
        failing: AtomicBool::new(false),
    });
    servers.push(Arc::downgrade(&h));
    h.gauge(true);
    let check = CHECK.lock().unwrap_or_else(PoisonError::into_inner).clone();
    if let (Some(check), Ok(runtime)) = (check, tokio::runtime::Handle::try_current()) {
        runtime.spawn(checks(
            Arc::downgrade(&h),
            probe(&check.path),
            check.interval,
        ));
    }
    h
}

/// Checks the server every `interval`, while it is in use.
async fn checks(server: Weak<Health>, probe: Probe, interval: Duration) {
    let within = interval.min(MAX_CHECK);
    loop {
        let passed = probe(within).await;
        let Some(server) = server.upgrade() else {
            return;
        };
        server.checked(passed);
        drop(server);
        tokio::time::sleep(interval).await;
    }
}

impl Health {
    /// `norepeat_gateway_upstream_server_up{server}`: 1 while it takes
    /// requests, 0 from its refusal until a request reaches it again, or
    /// from a failed check until one passes.
    fn gauge(&self, up: bool) {
        metrics::gauge!("norepeat_gateway_upstream_server_up", "server" => self.url.to_string())
            .set(if up { 1.0 } else { 0.0 });
    }

    /// Whether it takes requests at `now`.
    fn is_up(&self, now: Instant) -> bool {
        !self.failing.load(Ordering::Acquire)
            && self
                .refused_until
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_none_or(|until| now >= until)
    }

    /// It refused a connection: out for [`REFUSED_FOR`].
    pub(crate) fn refused(&self) {
        let now = Instant::now();
        let was_up = self.is_up(now);
        *self
            .refused_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(now + REFUSED_FOR);
        if was_up {
            self.gauge(false);
            tracing::warn!(
                server = %self.url,
                for_s = REFUSED_FOR.as_secs(),
                "upstream server refused a connection: taken out"
            );
        }
    }

    /// A request reached it: if it was out for a refusal, it is back.
    pub(crate) fn reached(&self) {
        let mut until = self
            .refused_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if until.take().is_some() {
            self.gauge(!self.failing.load(Ordering::Acquire));
            tracing::info!(server = %self.url, "upstream server reached again: back");
        }
    }

    /// A health check `passed` or not.
    fn checked(&self, passed: bool) {
        let was_failing = self.failing.swap(!passed, Ordering::AcqRel);
        match (was_failing, passed) {
            (false, false) => {
                self.gauge(false);
                tracing::warn!(
                    server = %self.url,
                    "upstream server failed its health check: taken out"
                );
            }
            (true, true) => {
                self.gauge(self.is_up(Instant::now()));
                tracing::info!(server = %self.url, "upstream server passed its health check: back");
            }
            _ => {}
        }
    }
}

/// A request outstanding on a server, until dropped.
#[derive(Debug)]
pub(crate) struct Lease(Arc<Health>);

impl Lease {
    pub(crate) fn new(server: &Arc<Health>) -> Self {
        server.outstanding.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(server))
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The server a request goes to next, among those it was not tried on
/// (`tried`, one bit each): the one with the fewest requests outstanding
/// among those up, ties in turn (`turn` counts the picks); when none of
/// them is up, the same among all of them. `None`: every one was tried.
pub(crate) fn pick(servers: &[Arc<Health>], turn: &AtomicUsize, tried: u64) -> Option<usize> {
    let n = servers.len();
    let start = turn.fetch_add(1, Ordering::Relaxed);
    let now = Instant::now();
    let mut best: Option<(usize, bool, usize)> = None;
    for k in 0..n {
        let i = (start + k) % n;
        if tried & (1 << i) != 0 {
            continue;
        }
        let up = servers[i].is_up(now);
        let outstanding = servers[i].outstanding.load(Ordering::Acquire);
        let better = match best {
            None => true,
            Some((_, best_up, best_out)) => {
                (up && !best_up) || (up == best_up && outstanding < best_out)
            }
        };
        if better {
            best = Some((i, up, outstanding));
        }
    }
    best.map(|(i, _, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(url: &str) -> Arc<Health> {
        Arc::new(Health {
            url: url.into(),
            outstanding: AtomicUsize::new(0),
            refused_until: Mutex::new(None),
            failing: AtomicBool::new(false),
        })
    }

    /// Ties go in turn; the fewest outstanding wins; one out is passed
    /// over while another is up, and tried when none is.
    #[test]
    fn the_least_busy_server_that_is_up_is_picked() {
        let servers = [server("a"), server("b")];
        let turn = AtomicUsize::new(0);
        let firsts: Vec<_> = (0..4).map(|_| pick(&servers, &turn, 0)).collect();
        assert_eq!(firsts, [Some(0), Some(1), Some(0), Some(1)]);
        let _busy = Lease::new(&servers[0]);
        for _ in 0..3 {
            assert_eq!(pick(&servers, &turn, 0), Some(1));
        }
        drop(_busy);
        servers[1].refused();
        for _ in 0..3 {
            assert_eq!(pick(&servers, &turn, 0), Some(0));
        }
        assert_eq!(pick(&servers, &turn, 0b01), Some(1), "the only one untried");
        assert_eq!(pick(&servers, &turn, 0b11), None);
        servers[0].checked(false);
        let any = pick(&servers, &turn, 0);
        assert!(any.is_some(), "every server out: tried anyway");
        servers[0].checked(true);
        assert_eq!(pick(&servers, &turn, 0), Some(0));
        servers[1].reached();
        assert!(servers[1].is_up(Instant::now()));
    }
}
