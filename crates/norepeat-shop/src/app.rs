//! The shop's state (its router is `routes::app`).

use crate::config::ShopConfig;
use crate::db::Db;
use crate::outage::Outage;
use crate::payments_store::PaymentsStore;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use norepeat::idempotency::DetachedTasks;
use norepeat::ratelimit::Quota;
use norepeat::store::{AnyStore, MemoryStore};
use norepeat::store::{Fallback, Resilient};
use norepeat::token::TokenGuard;
use norepeat::token::TokenSigner;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The store as every guard sees it: a time budget and a breaker in front
/// of the configured store.
pub type Primary = Resilient<Outage<AnyStore>>;
/// The store of fail-open routes: the primary with a local fallback.
pub type OpenStore = Fallback<Primary>;

/// Everything handlers share.
#[derive(Clone)]
pub struct AppState {
    /// The database.
    pub db: Db,
    /// The configuration.
    pub cfg: Arc<ShopConfig>,
    /// The primary store (for fail-closed routes).
    pub primary: Primary,
    /// The primary with the local fallback (for fail-open routes).
    pub open: OpenStore,
    /// Issues and consumes repeat tokens.
    pub tokens: TokenGuard<OpenStore>,
    /// Checks repeat tokens again in `POST /orders`, for the business key
    /// (the same secret as `tokens`).
    pub signer: TokenSigner,
    /// Renders `/metrics`.
    pub metrics: PrometheusHandle,
    /// Publishes order events.
    pub events: crate::events::Events,
    /// Takes the store down for the storm's outage scenario.
    pub outage: Outage<AnyStore>,
    /// Where `POST /payments` keeps its idempotency records.
    pub payments: PaymentsStore,
    /// The payment handlers the Idempotency-Key layer runs on for clients
    /// that left: `serve` waits for them at shutdown.
    pub detached: DetachedTasks,
}

/// The process-wide metrics recorder (installed once).
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be installed (tests): then this
            // handle renders an empty set, which is still valid output.
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}

/// Why the shop could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The database could not be opened or migrated.
    #[error("database: {0}")]
    Db(#[from] crate::db::DbError),
    /// The guard store could not be reached.
    #[error("store: {0}")]
    Store(#[from] norepeat::store::StoreError),
    /// The configuration is invalid.
    #[error("configuration: {0}")]
    Config(String),
    /// The listener could not be bound.
    #[error("listen: {0}")]
    Io(#[from] std::io::Error),
}

impl AppState {
    /// Opens the database and the store named by `cfg`.
    ///
    /// # Errors
    /// When either cannot be reached.
    pub async fn connect(cfg: ShopConfig) -> Result<Self, StartError> {
        // A wrong setting is refused before anything is opened.
        cfg.check_callback_secret().map_err(StartError::Config)?;
        cfg.idempotency_store().map_err(StartError::Config)?;
        if cfg.callback_verifier().is_none() {
            tracing::warn!(
                "NOREPEAT_CALLBACK_SECRET is not set: payment callbacks are accepted unsigned, \
                 so anyone who can reach POST /payments/callback can mark a payment paid"
            );
        }
        let db = Db::connect(cfg.database_url.as_deref()).await?;
        let store = match AnyStore::from_url(cfg.redis_url.as_deref()).await {
            Ok(s) => s,
            // Degrade, don't block: a shop whose Redis is down at start
            // serves with its guards' failure policies until Redis answers.
            Err(e @ norepeat::store::StoreError::Connection(_)) => match cfg.redis_url.as_deref() {
                Some(url) if url.starts_with("redis://") || url.starts_with("rediss://") => {
                    tracing::error!(error = %e, "Redis unreachable at start: serving degraded until it answers");
                    AnyStore::Redis(norepeat::store::RedisStore::connect_lazy(url)?)
                }
                _ => return Err(e.into()),
            },
            Err(e) => return Err(e.into()),
        };
        let events = crate::events::Events::start(&cfg, db.clone(), store.clone())
            .await
            .map_err(StartError::Config)?;
        Self::with(db, store, cfg, events).await
    }

    /// Builds the state from an open database and store.
    ///
    /// # Errors
    /// When the configuration is invalid (a blank callback secret, a bad
    /// rate) or the shared secret cannot be read.
    pub async fn with(
        db: Db,
        store: AnyStore,
        cfg: ShopConfig,
        events: crate::events::Events,
    ) -> Result<Self, StartError> {
        cfg.check_callback_secret().map_err(StartError::Config)?;
        Quota::parse(&cfg.flash_rate).map_err(|e| {
            StartError::Config(format!("NOREPEAT_FLASH_RATE={:?}: {e}", cfg.flash_rate))
        })?;
        Quota::parse(&cfg.payment_rate).map_err(|e| {
            StartError::Config(format!("NOREPEAT_PAYMENT_RATE={:?}: {e}", cfg.payment_rate))
        })?;
        // The recorder first, so the store's budget gauge is recorded from the start.
        let metrics = metrics_handle();
        let kind = cfg.idempotency_store().map_err(StartError::Config)?;
        let payments = PaymentsStore::open(kind, &store, &db).await?;
        let outage = Outage::new(store);
        // `store_timeout` is the floor of the adaptive budget, and
        // `store_timeout_max` its ceiling.
        let primary = Resilient::new(outage.clone())
            .max_timeout(cfg.store_timeout_max())
            .timeout(cfg.store_timeout())
            .breaker(5, Duration::from_secs(1));
        let open = if cfg.defence.local_fallback() {
            Fallback::new(primary.clone(), MemoryStore::default())
        } else {
            Fallback::disabled(primary.clone())
        };
        let signer = TokenSigner::new(db.shared_secret().await?);
        let tokens = TokenGuard::new(open.clone(), signer.clone())
            .ttl(Duration::from_secs(cfg.token_ttl_s.max(1)));
        Ok(Self {
            db,
            cfg: Arc::new(cfg),
            primary,
            open,
            tokens,
            signer,
            metrics,
            events,
            outage,
            payments,
            detached: DetachedTasks::new(),
        })
    }
}

impl AppState {
    /// The per-user quota of `POST /flash-sale/{sku}` (validated at start).
    #[must_use]
    pub fn flash_quota(&self) -> Quota {
        Quota::parse(&self.cfg.flash_rate).unwrap_or(Quota::per_second(DEFAULT_FLASH_RATE))
    }
}

const DEFAULT_FLASH_RATE: std::num::NonZeroU32 = match std::num::NonZeroU32::new(5) {
    Some(n) => n,
    None => panic!("5 is not zero"),
};

impl AppState {
    /// The per-user quota of `POST /payments` (validated at start).
    #[must_use]
    pub fn payment_quota(&self) -> Quota {
        Quota::parse(&self.cfg.payment_rate).unwrap_or(Quota::per_second(DEFAULT_PAYMENT_RATE))
    }

    /// The per-address quota of `POST /payments`: ten times the per-user
    /// one (an address may hold many users: an office, a carrier's NAT).
    #[must_use]
    pub fn payment_address_quota(&self) -> Quota {
        let user = self.payment_quota();
        Quota::new(user.max().saturating_mul(TEN), user.period())
            .unwrap_or(user)
            .allow_burst(user.burst().saturating_mul(TEN))
    }
}

const DEFAULT_PAYMENT_RATE: std::num::NonZeroU32 = match std::num::NonZeroU32::new(20) {
    Some(n) => n,
    None => panic!("20 is not zero"),
};

const TEN: std::num::NonZeroU32 = match std::num::NonZeroU32::new(10) {
    Some(n) => n,
    None => panic!("10 is not zero"),
};
