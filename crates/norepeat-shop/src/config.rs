//! The shop's configuration, from flags and environment variables.

use std::time::Duration;

/// Which defences the shop runs with. Everything but `Full` exists only so
/// `norepeat storm` can show what each layer does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum Defence {
    /// No guard, no unique key, stock read-then-write: the incident.
    Naive,
    /// The database alone: unique business key and conditional stock update.
    Db,
    /// The entry guard (tokens, fingerprints) in front of the database, with
    /// no local fallback: during a store outage it admits everything.
    GuardDb,
    /// Every layer (the default): guard, local fallback, database.
    #[default]
    Full,
}

impl Defence {
    /// Whether the entry guard is on.
    #[must_use]
    pub fn guard(self) -> bool {
        matches!(self, Defence::GuardDb | Defence::Full)
    }
    /// Whether orders go through the safe database path.
    #[must_use]
    pub fn safe_db(self) -> bool {
        !matches!(self, Defence::Naive)
    }
    /// Whether a store failure falls back to the instance's local memory.
    #[must_use]
    pub fn local_fallback(self) -> bool {
        matches!(self, Defence::Full)
    }
    /// The name used in the storm's table.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Defence::Naive => "naive",
            Defence::Db => "db",
            Defence::GuardDb => "guard+db",
            Defence::Full => "full",
        }
    }
}

/// Everything `serve` needs.
#[derive(Debug, Clone, clap::Args)]
pub struct ShopConfig {
    /// Address to listen on (`127.0.0.1:0` picks a free port).
    #[arg(long, env = "NOREPEAT_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// `redis://...`, `redis+sentinel://host:port,.../MASTER_NAME` or
    /// `redis+cluster://host:port,...`, each with
    /// `?replicas=N&replicas_timeout=T` if claims must wait for replicas;
    /// unset: in-process memory store.
    ///
    /// A URL the store refuses (an unknown scheme or query parameter)
    /// stops the start with the store's message.
    #[arg(long = "redis", env = "REDIS_URL")]
    pub redis_url: Option<String>,
    /// `sqlite://PATH?mode=rwc` or `postgres://...`; unset: `./norepeat-shop.db`.
    #[arg(long = "database", env = "DATABASE_URL")]
    pub database_url: Option<String>,
    /// Shared secret for `/admin/*` (header `X-Admin-Token`); unset or empty: admin routes answer 404.
    #[arg(long, env = "NOREPEAT_ADMIN_TOKEN")]
    pub admin_token: Option<String>,
    /// Shared secret of the payment provider: every `POST /payments/callback`
    /// must carry a valid `Norepeat-Signature`; unset: callbacks are accepted
    /// unsigned (and the shop warns at start); set but empty or only
    /// whitespace: the shop refuses to start.
    #[arg(long, env = "NOREPEAT_CALLBACK_SECRET", hide_env_values = true)]
    pub callback_secret: Option<String>,
    /// Serve `POST /demo/provider/notify`, a stand-in for the payment
    /// provider that signs a notice with the callback secret and delivers it.
    /// For the demo page only: it lets any caller mark a payment paid, so it
    /// is off unless asked for.
    #[arg(long, env = "NOREPEAT_DEMO_PROVIDER", default_value_t = false)]
    pub demo_provider: bool,
    /// Fingerprint window of `POST /orders/quick`, in milliseconds.
    #[arg(long, env = "NOREPEAT_FP_WINDOW_MS", default_value_t = 3000)]
    pub fp_window_ms: u64,
    /// Life of a repeat token, in seconds.
    #[arg(long, env = "NOREPEAT_TOKEN_TTL_S", default_value_t = 60)]
    pub token_ttl_s: u64,
    /// Simulated latency of the fake payment provider, in milliseconds.
    #[arg(long, env = "NOREPEAT_PAYMENT_LATENCY_MS", default_value_t = 0)]
    pub payment_latency_ms: u64,
    /// Per-user rate of `POST /flash-sale/{sku}` (`N/s`, `N/m`).
    #[arg(long, env = "NOREPEAT_FLASH_RATE", default_value = "5/s")]
    pub flash_rate: String,
    /// Per-user rate of `POST /payments` (`N/s`, `N/m`), checked before the
    /// Idempotency-Key is claimed; each client address gets 10 times it.
    #[arg(long, env = "NOREPEAT_PAYMENT_RATE", default_value = "20/s")]
    pub payment_rate: String,
    /// The floor of the guard store's time budget, in milliseconds (the
    /// budget follows the store's recent latency).
    #[arg(long, env = "NOREPEAT_STORE_TIMEOUT_MS", default_value_t = 50)]
    pub store_timeout_ms: u64,
    /// The ceiling of the guard store's time budget, in milliseconds: the
    /// longest a request waits on one guard store call, however slow the
    /// store has been.
    #[arg(long, env = "NOREPEAT_STORE_TIMEOUT_MAX_MS", default_value_t = 300)]
    pub store_timeout_max_ms: u64,
    /// `nats://...`: order events go through NATS JetStream; unset: in-process queue.
    #[arg(long, env = "NATS_URL")]
    pub nats_url: Option<String>,
    /// Publish every order event this many times.
    #[arg(long, env = "NOREPEAT_DUPLICATE_EVENTS", default_value_t = 1)]
    pub duplicate_events: u32,
    /// Seconds between reconciliation passes in each instance.
    #[arg(long, env = "NOREPEAT_RECONCILE_EVERY_S", default_value_t = 120)]
    pub reconcile_every_s: u64,
    /// Which defences to run (all but `full` are for the storm demo).
    #[arg(long, env = "NOREPEAT_DEFENCE", value_enum, default_value_t = Defence::Full)]
    pub defence: Defence,
    /// Where `POST /payments` keeps its idempotency records: `redis`,
    /// `memory` or `database`; unset: `redis` when `REDIS_URL` is set, else
    /// `memory`.
    #[arg(long = "idempotency-store", env = "NOREPEAT_IDEMPOTENCY_STORE")]
    pub idempotency_store: Option<String>,
    /// The largest `POST /payments` answer body kept for replay, in bytes.
    /// A larger one is answered whole, and its retries get its status with
    /// an empty body and `Idempotent-Body: omitted` (the payment is not
    /// made again).
    #[arg(long, env = "NOREPEAT_MAX_STORED_RESPONSE", default_value_t = 1 << 20)]
    pub max_stored_response: usize,
    /// Naive mode only: pause between reading and writing stock, in milliseconds
    /// (widens the race the incident is about).
    #[arg(long, env = "NOREPEAT_NAIVE_GAP_MS", default_value_t = 5)]
    pub naive_gap_ms: u64,
}

impl Default for ShopConfig {
    /// The documented defaults, ignoring flags and the environment.
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            redis_url: None,
            database_url: None,
            admin_token: None,
            callback_secret: None,
            demo_provider: false,
            fp_window_ms: 3000,
            token_ttl_s: 60,
            payment_latency_ms: 0,
            flash_rate: "5/s".into(),
            payment_rate: "20/s".into(),
            store_timeout_ms: 50,
            store_timeout_max_ms: 300,
            nats_url: None,
            duplicate_events: 1,
            reconcile_every_s: 120,
            defence: Defence::Full,
            naive_gap_ms: 5,
            idempotency_store: None,
            max_stored_response: 1 << 20,
        }
    }
}

/// Where `POST /payments` keeps its idempotency records
/// (`NOREPEAT_IDEMPOTENCY_STORE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdempotencyStore {
    /// The shared Redis (`REDIS_URL`).
    Redis,
    /// This process's memory.
    Memory,
    /// The shop's database, completed in the payment's transaction.
    Database,
}

impl IdempotencyStore {
    /// The value's name, as `/healthz` shows it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            IdempotencyStore::Redis => "redis",
            IdempotencyStore::Memory => "memory",
            IdempotencyStore::Database => "database",
        }
    }
}

impl ShopConfig {
    /// The payments' idempotency store: the configured one, or `redis` when
    /// `REDIS_URL` is set and `memory` otherwise.
    ///
    /// # Errors
    /// A value other than `redis`, `memory` or `database`, or `redis`
    /// without `REDIS_URL`.
    pub fn idempotency_store(&self) -> Result<IdempotencyStore, String> {
        let redis = self.redis_url.as_deref().is_some_and(|u| !u.is_empty());
        match self.idempotency_store.as_deref().map(str::trim) {
            None | Some("") if redis => Ok(IdempotencyStore::Redis),
            None | Some("") => Ok(IdempotencyStore::Memory),
            Some("redis") if redis => Ok(IdempotencyStore::Redis),
            Some("redis") => Err(
                "NOREPEAT_IDEMPOTENCY_STORE=redis needs REDIS_URL (or use memory or database)"
                    .into(),
            ),
            Some("memory") => Ok(IdempotencyStore::Memory),
            Some("database") => Ok(IdempotencyStore::Database),
            Some(other) => Err(format!(
                "NOREPEAT_IDEMPOTENCY_STORE={other:?} is not one of redis, memory, database"
            )),
        }
    }

    /// The fingerprint window.
    #[must_use]
    pub fn fp_window(&self) -> Duration {
        Duration::from_millis(self.fp_window_ms.max(1))
    }
    /// The admin token, if admin is on (set and not empty).
    #[must_use]
    pub fn admin_token(&self) -> Option<&str> {
        self.admin_token.as_deref().filter(|t| !t.is_empty())
    }
    /// The verifier of the payment provider's callbacks, if a secret is set
    /// (and not blank: [`check_callback_secret`](Self::check_callback_secret)
    /// refuses that at start).
    #[must_use]
    pub fn callback_verifier(&self) -> Option<norepeat::webhook::WebhookVerifier> {
        self.callback_secret
            .as_deref()
            .filter(|t| !t.trim().is_empty())
            .map(norepeat::webhook::WebhookVerifier::new)
    }

    /// Refuses a callback secret that is set but empty or only whitespace:
    /// someone meant to sign the callbacks, and serving them unsigned (or
    /// signed with a blank key) would turn that off without a word. Unset
    /// is the documented unsigned demo mode.
    ///
    /// # Errors
    /// A message naming `NOREPEAT_CALLBACK_SECRET`.
    pub fn check_callback_secret(&self) -> Result<(), String> {
        match self.callback_secret.as_deref() {
            Some(s) if s.trim().is_empty() => Err(
                "NOREPEAT_CALLBACK_SECRET is set but empty: set the payment provider's secret, \
                 or unset the variable to accept unsigned callbacks (demo only)"
                    .into(),
            ),
            _ => Ok(()),
        }
    }
    /// The store time budget.
    #[must_use]
    pub fn store_timeout(&self) -> Duration {
        Duration::from_millis(self.store_timeout_ms.max(1))
    }

    /// The ceiling of the guard store's budget (never below its floor).
    pub fn store_timeout_max(&self) -> Duration {
        Duration::from_millis(self.store_timeout_max_ms.max(1))
    }
}

#[cfg(test)]
mod callback_secret_tests {
    use super::*;

    fn with(secret: Option<&str>) -> ShopConfig {
        ShopConfig {
            callback_secret: secret.map(Into::into),
            ..ShopConfig::default()
        }
    }

    #[test]
    fn a_blank_secret_is_refused_and_unset_is_unsigned() {
        for blank in ["", " ", "\t\n "] {
            let e = with(Some(blank)).check_callback_secret().unwrap_err();
            assert!(e.contains("NOREPEAT_CALLBACK_SECRET"), "{blank:?}: {e}");
            assert!(with(Some(blank)).callback_verifier().is_none());
        }
        assert_eq!(with(None).check_callback_secret(), Ok(()));
        assert!(with(None).callback_verifier().is_none());
        assert_eq!(with(Some("whsec")).check_callback_secret(), Ok(()));
        assert!(with(Some("whsec")).callback_verifier().is_some());
    }
}

#[cfg(test)]
mod idempotency_store_tests {
    use super::*;

    fn pick(redis: Option<&str>, value: Option<&str>) -> Result<IdempotencyStore, String> {
        ShopConfig {
            redis_url: redis.map(Into::into),
            idempotency_store: value.map(Into::into),
            ..ShopConfig::default()
        }
        .idempotency_store()
    }

    #[test]
    fn defaults_follow_redis_url_and_bad_values_are_refused() {
        let redis = Some("redis://127.0.0.1:6379");
        assert_eq!(pick(None, None), Ok(IdempotencyStore::Memory));
        assert_eq!(pick(redis, None), Ok(IdempotencyStore::Redis));
        assert_eq!(pick(redis, Some("")), Ok(IdempotencyStore::Redis));
        assert_eq!(pick(redis, Some("memory")), Ok(IdempotencyStore::Memory));
        assert_eq!(pick(None, Some("database")), Ok(IdempotencyStore::Database));
        assert_eq!(
            pick(redis, Some("database")),
            Ok(IdempotencyStore::Database)
        );
        assert!(pick(None, Some("redis")).unwrap_err().contains("REDIS_URL"));
        for bad in ["Database", "postgres", "dynamo"] {
            assert!(pick(redis, Some(bad)).unwrap_err().contains(bad), "{bad}");
        }
    }
}
