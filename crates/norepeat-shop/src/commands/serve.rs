//! `norepeat serve`: run the shop.

use crate::app::{AppState, StartError, app};
use crate::config::ShopConfig;
use std::io::Write;
use std::time::Duration;

/// Runs the shop until Ctrl-C.
///
/// # Errors
/// When the database, the store or the listener cannot be opened.
pub async fn run(cfg: ShopConfig) -> Result<(), StartError> {
    let listener = tokio::net::TcpListener::bind(&cfg.listen).await?;
    let state = AppState::connect(cfg).await?;
    spawn_reconciler(&state);
    let addr = listener.local_addr()?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on http://{addr}")?;
        out.flush()?;
    }
    // With the peer's address: `POST /payments` is rate limited per address.
    let app = app(state).into_make_service_with_connect_info::<std::net::SocketAddr>();
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
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
