//! Serving on a listener: graceful shutdown, reload on change and SIGHUP.

use super::admin;
use super::gateway::Gateway;

use crate::config::Config;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

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
    let gateway = Arc::new(gateway);
    let limits = gateway.limits;
    let tls = gateway.tls.clone();
    let draining = gateway.draining.clone();
    let drain_delay = gateway.drain_delay;
    let app = admin::router(Arc::clone(&gateway));
    let detached = gateway.detached.clone();
    let stopping = gateway.stopping.clone();
    if let Some(addr) = gateway.admin {
        let admin = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
            std::io::Error::new(e.kind(), format!("admin: cannot listen on {addr}: {e}"))
        })?;
        tracing::info!(addr = %admin.local_addr()?, "admin listener");
        let app = admin::admin_router(Arc::clone(&gateway));
        tokio::spawn(async move {
            if let Err(e) = axum::serve(admin, app).await {
                tracing::error!(error = %e, "the admin listener failed");
            }
        });
    }
    if let Some(path) = file {
        tokio::spawn(watch(gateway, path));
    }
    // When the stop was asked: the grace counts from there.
    let (tx, mut rx) = tokio::sync::watch::channel(None);
    let asked = rx.clone();
    let server = super::connection::serve(listener, app, limits, tls, async move {
        stop_signal().await;
        // Readiness first, while the listener still accepts: the load
        // balancer takes the instance out before anyone is refused. A
        // second signal cuts the delay short.
        draining.cancel();
        tracing::info!(
            drain_delay_ms = u64::try_from(drain_delay.as_millis()).unwrap_or(u64::MAX),
            "draining: readiness answers 503, still accepting"
        );
        tokio::select! {
            () = tokio::time::sleep(drain_delay) => {}
            () = stop_signal() => {}
        }
        tracing::info!("no longer accepting: finishing the requests in flight (at most 10 s)");
        let _ = tx.send(Some(tokio::time::Instant::now() + GRACE));
    });
    let grace = async move {
        match rx.wait_for(Option::is_some).await.map(|at| *at) {
            Ok(Some(at)) => tokio::time::sleep_until(at).await,
            // No stop was asked: the server's own end decides.
            _ => std::future::pending().await,
        }
    };
    let mut server = std::pin::pin!(server);
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
pub(super) async fn watch(gw: Arc<Gateway>, path: PathBuf) {
    let stat = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .map(|m| (m.modified().ok(), m.len()))
    };
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
        seen = super::files::settled(&path, now, stat).await;
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

pub(super) async fn stop_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = term.recv() => {},
            _ = ctrl_c => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
