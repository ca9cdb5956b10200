//! `norepeat serve`: run the shop.

use crate::app::{AppState, StartError};
use crate::config::ShopConfig;
use crate::routes::app;
use std::future::IntoFuture;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// How long a shutdown waits for requests in flight and detached handlers.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Runs the shop until `SIGTERM` or Ctrl-C, then shuts down gracefully:
/// stops accepting, lets the requests in flight and the payment handlers
/// still running for clients that left finish, for at most
/// [`SHUTDOWN_GRACE`] in all, and returns (the process exits 0).
///
/// # Errors
/// When the database, the store or the listener cannot be opened.
pub async fn run(cfg: ShopConfig) -> Result<(), StartError> {
    let listener = tokio::net::TcpListener::bind(&cfg.listen)
        .await
        .map_err(|e| {
            StartError::Config(format!(
                "cannot listen on {} (--listen or NOREPEAT_LISTEN): {e}",
                cfg.listen
            ))
        })?;
    let state = AppState::connect(cfg).await?;
    spawn_reconciler(&state);
    let addr = listener.local_addr()?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on http://{addr}")?;
        out.flush()?;
    }
    let detached = state.detached.clone();
    let stopping = Arc::new(Notify::new());
    // With the peer's address: `POST /payments` is rate limited per address.
    let app = app(state).into_make_service_with_connect_info::<std::net::SocketAddr>();
    let server = axum::serve(listener, app).with_graceful_shutdown({
        let stopping = Arc::clone(&stopping);
        async move {
            shutdown_signal().await;
            stopping.notify_one();
        }
    });
    let mut server = std::pin::pin!(server.into_future());
    // Serve until the signal; the grace period starts with it.
    let ended = tokio::select! {
        served = &mut server => {
            served?;
            true
        }
        () = stopping.notified() => false,
    };
    let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
    if !ended {
        tracing::info!("shutting down: finishing the requests in flight");
        match tokio::time::timeout_at(deadline, &mut server).await {
            Ok(served) => served?,
            Err(_) => tracing::warn!("requests still open after the grace period"),
        }
    }
    detached.close();
    if tokio::time::timeout_at(deadline, detached.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            running = detached.len(),
            "payment handlers still running after the grace period"
        );
    }
    Ok(())
}

/// Resolves on `SIGTERM` (what a process manager sends) or Ctrl-C.
async fn shutdown_signal() {
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}

/// Runs a reconciliation pass every `NOREPEAT_RECONCILE_EVERY_S` seconds.
fn spawn_reconciler(state: &AppState) {
    let db = state.db.clone();
    let events = state.events.clone();
    let every = Duration::from_secs(state.cfg.reconcile_every_s.max(1));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        loop {
            tick.tick().await;
            match db.reconcile().await {
                Ok(r) if r.total() > 0 => {
                    tracing::warn!(
                        repaired = r.total(),
                        ?r,
                        "reconciliation repaired half-done work"
                    );
                    metrics::counter!("shop_reconcile_repairs_total").increment(r.total() as u64);
                    crate::events::kick(&events);
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "reconciliation pass failed"),
            }
            match db.drop_ended_windows().await {
                Ok(n) => tracing::debug!(rows = n, "ended order windows deleted"),
                Err(e) => tracing::warn!(error = %e, "ended order windows not deleted"),
            }
        }
    });
}

/// A shop served in this process (the storm's and the tests' instances).
pub struct InProcess {
    /// `http://127.0.0.1:PORT`.
    pub base_url: String,
    /// The instance's state (its store switch, its database).
    pub state: AppState,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl InProcess {
    /// Serves `state` on a free loopback port.
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn start(state: AppState) -> Result<Self, StartError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base_url = format!("http://{}", listener.local_addr()?);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let router = app(state.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        Ok(Self {
            base_url,
            state,
            stop: Some(tx),
            task,
        })
    }

    /// Stops serving and waits for open requests to finish.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}
