// Over 400 lines on purpose: a listener's life in order: bind, serve, drain on SIGTERM, reload on a change of the file and on SIGHUP.
//! Serving on a listener: graceful shutdown, reload on change and SIGHUP.

pub(crate) mod connection;
pub(crate) mod lane;
pub(crate) mod routed;
pub(crate) mod timed;

use crate::serve::gateway::Gateway;
use crate::serve::own as admin;

use crate::config::Config;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Serves `gateway` on `listener` until `SIGTERM` (or Ctrl-C): readiness
/// then answers 503 while the listener still accepts for the file's
/// `drain_delay` (a second signal cuts it short), then the listener
/// stops accepting and requests in flight finish for at most 10 s. With `file`, the file is
/// read again when it changes (polled every 500 ms) and on `SIGHUP`: a
/// valid one replaces the routes ([`Gateway::reload`]), an invalid one is
/// logged and the old routes stay.
///
/// An upstream call still waiting when the grace is over is not dropped
/// with the process: it ends as an unknown outcome (as a timeout does), so
/// an idempotency route with `ambiguous: keep` records that for its key,
/// and its client gets 504 `upstream_timeout`. The process then exits
/// within 2 s more.
///
/// # Errors
/// The listener fails.
pub async fn serve(
    gateway: Gateway,
    listener: tokio::net::TcpListener,
    file: Option<PathBuf>,
) -> std::io::Result<()> {
    serve_on(gateway, Listening::Shared(listener), file).await
}

/// Serves `gateway` as [`serve`] does, on one event loop per socket of
/// `workers` (see [`Workers`]): the calling task's runtime serves the first
/// socket, a thread of its own (a single-threaded runtime) each other one.
/// Call it on a current-thread runtime, whose thread then is the first
/// worker (on a multi-threaded one it works, its threads sharing the first
/// worker's upstream pool).
///
/// ```no_run
/// use norepeat_gateway::{config::Config, serve::{Gateway, Workers, serve_workers}};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let config = Config::load("gateway.yaml".as_ref())?;
/// let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
/// runtime.block_on(async {
///     // Before the gateway is built: its upstream pools are one per worker.
///     let workers = Workers::bind(config.listen, 2)?;
///     let gateway = Gateway::build(&config, None).await?;
///     serve_workers(gateway, workers, None).await?;
///     Ok(())
/// })
/// # }
/// ```
///
/// # Errors
/// A worker's runtime or thread cannot be started.
pub async fn serve_workers(
    gateway: Gateway,
    workers: Workers,
    file: Option<PathBuf>,
) -> std::io::Result<()> {
    serve_on(gateway, Listening::PerWorker(workers.listeners), file).await
}

/// Listening sockets for [`serve_workers`]: one per worker, all on one
/// address with `SO_REUSEPORT`, the kernel spreading new connections
/// between them.
#[derive(Debug)]
pub struct Workers {
    listeners: Vec<std::net::TcpListener>,
}

impl Workers {
    /// Binds `n` sockets (at least one) on `addr` (port 0: the first picks
    /// a free port, the others take it), and makes every upstream pool
    /// built from now on one pool per worker: bind before
    /// [`Gateway::build`].
    ///
    /// # Errors
    /// A socket cannot be made or bound (the address is taken, not this
    /// machine's); on a platform without `SO_REUSEPORT`, always.
    ///
    /// # Panics
    /// Outside a tokio runtime (a socket is registered with the runtime's
    /// reactor to listen, then handed back for the worker that serves it).
    pub fn bind(addr: std::net::SocketAddr, n: usize) -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            let listeners = crate::serve::workers::listeners(addr, n)?;
            crate::serve::workers::set_count(listeners.len());
            Ok(Self { listeners })
        }
        #[cfg(not(unix))]
        {
            let _ = (addr, n);
            Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "one listener per worker needs SO_REUSEPORT",
            ))
        }
    }

    /// The address the sockets listen on.
    ///
    /// # Errors
    /// The socket cannot say (not seen on Linux).
    pub fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.listeners[0].local_addr()
    }

    /// How many workers.
    #[must_use]
    pub fn len(&self) -> usize {
        self.listeners.len()
    }

    /// Never: [`Workers::bind`] binds at least one socket.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.listeners.is_empty()
    }
}

enum Listening {
    /// One listener, on the calling runtime.
    Shared(tokio::net::TcpListener),
    /// One per worker.
    PerWorker(Vec<std::net::TcpListener>),
}

async fn serve_on(
    gateway: Gateway,
    listening: Listening,
    file: Option<PathBuf>,
) -> std::io::Result<()> {
    let gateway = Arc::new(gateway);
    let limits = gateway.limits;
    let tls = match gateway.tls.clone() {
        None => None,
        Some(files) => {
            let (acceptor, certs) =
                crate::serve::tls::acceptor(&files).map_err(std::io::Error::other)?;
            tokio::spawn(crate::serve::tls::watch(certs, files));
            Some(acceptor)
        }
    };
    // One cap on open connections for the process, whichever worker
    // accepted them.
    let slots = Arc::new(Semaphore::new(
        usize::try_from(limits.max_connections.get()).unwrap_or(usize::MAX),
    ));
    let draining = gateway.draining.clone();
    let drain_delay = gateway.drain_delay;
    let front = admin::Front::new(Arc::clone(&gateway));
    let detached = gateway.detached.clone();
    let stopping = gateway.stopping.clone();
    gateway.listen_admin()?;
    let admin = gateway
        .admin_listener
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    if let Some(admin) = admin {
        tracing::info!(addr = %admin.local_addr()?, "admin listener");
        let front = admin::Front::admin(Arc::clone(&gateway));
        // The traffic's limits, and a cap of its own: a flood of admin
        // connections waits in its listen queue, never takes the
        // descriptors the traffic needs.
        let slots = Arc::new(Semaphore::new(ADMIN_CONNECTIONS));
        tokio::spawn(async move {
            let forever = std::future::pending::<()>();
            if let Err(e) =
                crate::serve::listen::connection::serve(admin, front, limits, None, slots, forever)
                    .await
            {
                tracing::error!(error = %e, "the admin listener failed");
            }
        });
    }
    tokio::spawn(user_signals(Arc::clone(&gateway)));
    tokio::spawn(crate::serve::gateway::watch_epoch(Arc::clone(&gateway)));
    if let Some(path) = file {
        tokio::spawn(watch(gateway, path));
    }
    // When the stop was asked: the grace counts from there.
    let (tx, mut rx) = tokio::sync::watch::channel(None);
    let asked = rx.clone();
    // Cancelled when the listeners stop accepting.
    let accepting = CancellationToken::new();
    tokio::spawn({
        let accepting = accepting.clone();
        async move {
            stop_signal(1).await;
            // Readiness first, while the listener still accepts: the load
            // balancer takes the instance out before anyone is refused. A
            // second signal cuts the delay short.
            draining.start();
            tracing::info!(
                drain_delay_ms = u64::try_from(drain_delay.as_millis()).unwrap_or(u64::MAX),
                "draining: readiness answers 503, still accepting"
            );
            tokio::select! {
                () = tokio::time::sleep(drain_delay) => {}
                () = stop_signal(2) => {}
            }
            tracing::info!("no longer accepting: finishing the requests in flight (at most 10 s)");
            let _ = tx.send(Some(tokio::time::Instant::now() + GRACE));
            accepting.cancel();
        }
    });
    let served = Served {
        front,
        limits,
        tls,
        slots,
        accepting,
    };
    let server: std::pin::Pin<Box<dyn Future<Output = std::io::Result<()>>>> = match listening {
        Listening::Shared(listener) => Box::pin(served.on(listener)),
        Listening::PerWorker(listeners) => Box::pin(served.per_worker(listeners)?),
    };
    let grace = async move {
        match rx.wait_for(Option::is_some).await.map(|at| *at) {
            Ok(Some(at)) => tokio::time::sleep_until(at).await,
            // No stop was asked: the server's own end decides.
            _ => std::future::pending().await,
        }
    };
    let mut server = server;
    let served = tokio::select! {
        r = &mut server => r,
        () = grace => {
            // The calls still waiting end as unknown outcomes, recorded;
            // their clients get their answers, and the server ends.
            stopping.cancel();
            tokio::time::timeout(SETTLE, &mut server).await.unwrap_or_else(|_| {
                tracing::warn!("requests still unanswered after the grace period");
                Ok(())
            })
        }
    };
    // The upstream calls of clients that left finish too, within the same
    // grace: each completes its key's record (a replay, or the unknown
    // outcome), so a retry after the restart is not run again.
    detached.close();
    let until = (*asked.borrow()).unwrap_or_else(|| tokio::time::Instant::now() + GRACE);
    if tokio::time::timeout_at(until, detached.wait())
        .await
        .is_err()
    {
        stopping.cancel();
        if tokio::time::timeout(SETTLE, detached.wait()).await.is_err() {
            tracing::warn!("upstream calls still running after the grace period");
        }
    }
    tracing::info!("drained: exiting");
    served
}

/// The admin listener's connections open at once (a scraper, a probe or
/// two, an operator): past it, new ones wait in its listen queue.
const ADMIN_CONNECTIONS: usize = 32;

/// What each listener serves, and how.
#[derive(Clone)]
struct Served {
    front: admin::Front,
    limits: crate::config::Limits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    slots: Arc<Semaphore>,
    accepting: CancellationToken,
}

impl Served {
    /// Serves `listener` on the calling runtime until the listeners stop
    /// accepting and its connections are done.
    async fn on(self, listener: tokio::net::TcpListener) -> std::io::Result<()> {
        let Self {
            front,
            limits,
            tls,
            slots,
            accepting,
        } = self;
        crate::serve::listen::connection::serve(
            listener,
            front,
            limits,
            tls,
            slots,
            accepting.cancelled_owned(),
        )
        .await
    }

    /// Serves the first of `listeners` in a task of the calling runtime
    /// and each other one on a thread of its own; resolves when all are
    /// done. A worker's thread then keeps its runtime (the upstream calls
    /// of clients that left, the store's retries go on there) until the
    /// process ends.
    fn per_worker(
        self,
        listeners: Vec<std::net::TcpListener>,
    ) -> std::io::Result<impl Future<Output = std::io::Result<()>>> {
        let mut done = Vec::with_capacity(listeners.len());
        for (i, listener) in listeners.into_iter().enumerate() {
            let (finished, wait) = tokio::sync::oneshot::channel();
            done.push(wait);
            let served = self.clone();
            let run = async move {
                let result = match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => served.on(listener).await,
                    Err(e) => Err(e),
                };
                let _ = finished.send(result);
            };
            if i == 0 {
                tokio::spawn(run);
                continue;
            }
            std::thread::Builder::new()
                .name(format!("norepeat-worker-{i}"))
                .spawn(move || {
                    crate::serve::workers::enter(i);
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build();
                    match runtime {
                        Ok(runtime) => runtime.block_on(async move {
                            run.await;
                            std::future::pending::<()>().await;
                        }),
                        Err(e) => tracing::error!(worker = i, error = %e, "cannot start the worker's runtime"),
                    }
                })?;
        }
        Ok(async move {
            let mut result = Ok(());
            for wait in done {
                match wait.await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::error!(error = %e, "a worker stopped serving");
                        if result.is_ok() {
                            result = Err(e);
                        }
                    }
                    // Its runtime did not start (logged).
                    Err(_) => {}
                }
            }
            result
        })
    }
}

/// How long a stop waits for requests in flight and for the upstream calls
/// of clients that left.
const GRACE: Duration = Duration::from_secs(10);

/// How long, after the grace, the calls given up as unknown outcomes have
/// to record that and answer (a store write each).
const SETTLE: Duration = Duration::from_secs(2);

/// Reloads `path` when its modification time changes or on `SIGHUP`,
/// once the file has stopped changing: it is read only after two looks
/// `files::SETTLED` apart find the same modification time and length, so a file
/// being written is never read half-way (a file written in two goes, with
/// a pause longer than that between, can still be: write the new file
/// beside the old and rename it into place, which is atomic). Counts
/// `norepeat_gateway_reloads_total{result="applied"|"failed"}`.
/// On `SIGUSR1` (logrotate's usual signal), the access log's file is
/// opened again at its path: the lines go to the new file once the old one
/// was moved away. `SIGUSR2` is logged and otherwise ignored: no common
/// signal ends the gateway without a line saying so.
pub(crate) async fn user_signals(gw: Arc<Gateway>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut usr1), Ok(mut usr2)) = (
        signal(SignalKind::user_defined1()),
        signal(SignalKind::user_defined2()),
    ) else {
        tracing::warn!("cannot listen for SIGUSR1 and SIGUSR2");
        return;
    };
    loop {
        tokio::select! {
            _ = usr1.recv() => match gw.access.as_ref().map(crate::serve::log::access::Sink::reopen) {
                Some(Ok(())) => tracing::info!("SIGUSR1: the access log was opened again"),
                Some(Err(e)) => tracing::error!(error = %e, "SIGUSR1: the access log cannot be opened again; lines go to the file open before"),
                None => tracing::info!("SIGUSR1: no access log file to open again"),
            },
            _ = usr2.recv() => tracing::info!("SIGUSR2: ignored (SIGUSR1 reopens the access log, SIGHUP reloads the file, SIGTERM drains)"),
        }
    }
}

pub(crate) async fn watch(gw: Arc<Gateway>, path: PathBuf) {
    let stat = crate::serve::files::stat;
    let mut seen = stat(&path);
    let mut token_wait = Duration::from_millis(500);
    let mut next_token_try = tokio::time::Instant::now();
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        #[cfg(unix)]
        let hangup = async {
            match hup.as_mut() {
                Some(h) => {
                    h.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let hangup = std::future::pending::<()>();
        let by_signal = tokio::select! {
            () = hangup => true,
            () = tokio::time::sleep(Duration::from_millis(500)) => false,
        };
        let now = stat(&path);
        if !by_signal && now == seen {
            // Token routes built while the store was down are built again
            // (from the file as it is) until the store gives the secret:
            // not a reload (not counted), and backing off from 1 s to 30 s
            // while the secret stays unreadable.
            let pending = gw.live.load().tokens_pending && gw.store.is_connected();
            if pending && tokio::time::Instant::now() >= next_token_try {
                if let Ok(config) = Config::load(&path) {
                    let _ = gw.reload(&config).await;
                }
                if gw.live.load().tokens_pending {
                    token_wait = (token_wait * 2).min(Duration::from_secs(30));
                    next_token_try = tokio::time::Instant::now() + token_wait;
                } else {
                    tracing::info!("the token secret is read: token routes guard again");
                }
            }
            continue;
        }
        seen = crate::serve::files::settled(&path, now, stat).await;
        let result = match Config::load(&path) {
            Ok(config) => gw.reload(&config).await.map_err(|e| e.to_string()),
            Err(problems) => Err(format!("\n{problems}")),
        };
        *gw.last_reload.lock().unwrap_or_else(|p| p.into_inner()) = Some(result.clone());
        match result {
            Ok(n) => {
                metrics::counter!("norepeat_gateway_reloads_total", "result" => "applied")
                    .increment(1);
                tracing::info!(file = %path.display(), routes = n, "reloaded");
            }
            Err(e) => {
                metrics::counter!("norepeat_gateway_reloads_total", "result" => "failed")
                    .increment(1);
                tracing::error!(file = %path.display(), "not reloaded, the old routes stay: {e}");
            }
        }
    }
}

/// How many stop signals (`SIGTERM`, Ctrl-C) the process has had, counted
/// from the moment [`arm_stop_signal`] ran.
static STOPS: std::sync::OnceLock<tokio::sync::watch::Receiver<u32>> = std::sync::OnceLock::new();

/// Takes `SIGTERM` and Ctrl-C over and counts them, once per process (a
/// second call does nothing). The binary calls it before it says it
/// listens: a stop asked the moment after is a drain, not the signal's
/// default action, which ends the process at once.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> std::io::Result<()> {
/// norepeat_gateway::serve::arm_stop_signal()?;
/// // Once armed, a second call changes nothing.
/// norepeat_gateway::serve::arm_stop_signal()?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// The signal handler cannot be installed.
pub fn arm_stop_signal() -> std::io::Result<()> {
    if STOPS.get().is_some() {
        return Ok(());
    }
    #[cfg(unix)]
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let (tx, rx) = tokio::sync::watch::channel(0u32);
    if STOPS.set(rx).is_err() {
        return Ok(());
    }
    tokio::spawn(async move {
        loop {
            #[cfg(unix)]
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            #[cfg(not(unix))]
            let _ = tokio::signal::ctrl_c().await;
            tx.send_modify(|n| *n += 1);
        }
    });
    Ok(())
}

/// Waits until the process has had its `nth` stop signal (1: start
/// draining; 2: cut the drain short).
pub(crate) async fn stop_signal(nth: u32) {
    if arm_stop_signal().is_err() {
        // No handler: nothing will ever ask.
        std::future::pending::<()>().await;
    }
    let Some(rx) = STOPS.get() else {
        return std::future::pending().await;
    };
    let mut rx = rx.clone();
    let _ = rx.wait_for(|n| *n >= nth).await;
}
