//! The shops a storm row runs against (started in this process, naive ones
//! behind gateways, or the `--target` shops), their shared database,
//! stocking, the outage switch, and the damage counted back from the
//! database.

use super::gateway;
use super::harness::RowCtx;
use super::{StormArgs, StormError};
use crate::app::AppState;
use crate::commands::serve::InProcess;
use crate::config::{Defence, ShopConfig};
use crate::db::Db;
use crate::events::Events;
use norepeat::store::{AnyStore, BreakerState};
use norepeat_testkit::{GatewayProcess, gateway_binary};
use serde_json::{Value, json};

/// The database the storm's own shops share, and whether it is a temp file.
pub(super) struct TempDb {
    pub(super) url: String,
    file: Option<std::path::PathBuf>,
}

impl TempDb {
    pub(super) fn new(url: Option<&str>) -> Self {
        match url {
            Some(u) => Self {
                url: u.to_owned(),
                file: None,
            },
            None => {
                let path = std::env::temp_dir()
                    .join(format!("norepeat-storm-{}.db", rand::random::<u64>()));
                Self {
                    url: format!("sqlite://{}?mode=rwc", path.display()),
                    file: Some(path),
                }
            }
        }
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        if let Some(f) = &self.file {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", f.display()));
            }
        }
    }
}

/// The shops of one defence.
pub(super) struct Shops {
    /// Where the clients send their requests: the shops, or the gateways
    /// in front of them.
    pub(super) bases: Vec<String>,
    pub(super) running: Vec<InProcess>,
    /// The gateways in front of `running` (the `gateway` defence), killed
    /// when these shops are stopped or dropped.
    gateways: Vec<GatewayProcess>,
    db: Option<Db>,
}

impl Shops {
    pub(super) async fn start(
        defence: Defence,
        n: usize,
        db_url: &str,
        store: &AnyStore,
    ) -> Result<Self, StormError> {
        let mut running = Vec::new();
        let mut db = None;
        for _ in 0..n {
            let instance_db = Db::connect(Some(db_url)).await?;
            db.get_or_insert_with(|| instance_db.clone());
            let cfg = ShopConfig {
                defence,
                ..ShopConfig::default()
            };
            let state = AppState::with(instance_db, store.clone(), cfg, Events::disabled()).await?;
            running.push(InProcess::start(state).await?);
        }
        Ok(Self {
            bases: running.iter().map(|r| r.base_url.clone()).collect(),
            running,
            gateways: Vec::new(),
            db,
        })
    }

    /// The `gateway` defence: `n` naive shops, and two gateways (or `n`,
    /// if more) in front of them, gateway `i` forwarding to shop `i mod n`,
    /// all gateways on the Redis at `redis_url`.
    pub(super) async fn behind_gateways(
        n: usize,
        db_url: &str,
        store: &AnyStore,
        redis_url: &str,
    ) -> Result<Self, StormError> {
        let bin = gateway_binary().map_err(StormError::Gateway)?;
        let mut shops = Self::start(Defence::Naive, n, db_url, store).await?;
        let secret = format!(
            "{:032x}{:032x}",
            rand::random::<u128>(),
            rand::random::<u128>()
        );
        for i in 0..n.max(2) {
            let upstream = &shops.running[i % shops.running.len()].base_url;
            let file = gateway::storm_file(upstream, redis_url, &secret);
            // On an error `shops` is dropped: the gateways started so far die with it.
            let g = GatewayProcess::start(&bin, &file)
                .await
                .map_err(StormError::Gateway)?;
            shops.gateways.push(g);
        }
        shops.bases = shops.gateways.iter().map(|g| g.base_url.clone()).collect();
        Ok(shops)
    }

    /// Whether the clients talk to gateways: they then take their page
    /// tokens from the gateway, and the scenarios that would call the
    /// shop's message consumer directly (past any gateway) go over HTTP.
    pub(super) fn via_gateway(&self) -> bool {
        !self.gateways.is_empty()
    }

    pub(super) async fn targets(args: &StormArgs, db_url: &str) -> Result<Self, StormError> {
        let db = match &args.database_url {
            Some(_) => Some(Db::connect(Some(db_url)).await?),
            None => None,
        };
        Ok(Self {
            bases: args
                .targets
                .iter()
                .map(|t| t.trim_end_matches('/').to_owned())
                .collect(),
            running: Vec::new(),
            gateways: Vec::new(),
            db,
        })
    }

    pub(super) async fn stock(
        &self,
        http: &reqwest::Client,
        sku: &str,
        units: i64,
        admin: Option<&str>,
    ) -> Result<(), StormError> {
        if self.running.is_empty() {
            let token = admin.ok_or_else(|| {
                StormError::Target(
                    "--target needs NOREPEAT_ADMIN_TOKEN to stock its product".into(),
                )
            })?;
            let res = http
                .put(format!("{}/admin/stock/{sku}", self.bases[0]))
                .header("x-admin-token", token)
                .json(&json!({"available": units}))
                .send()
                .await
                .map_err(|e| StormError::Target(e.to_string()))?;
            if !res.status().is_success() {
                return Err(StormError::Target(format!(
                    "stocking {sku}: {}",
                    res.status()
                )));
            }
            return Ok(());
        }
        if let Some(db) = &self.db {
            db.set_stock(sku, units).await?;
        }
        Ok(())
    }

    pub(super) fn set_outage(&self, down: bool) {
        for r in &self.running {
            r.state.outage.set_down(down);
        }
    }

    /// Whether every instance's store breaker is closed (none of them has
    /// an outage left to recover from).
    pub(super) fn breakers_closed(&self) -> bool {
        self.running
            .iter()
            .all(|r| r.state.primary.circuit().state() == BreakerState::Closed)
    }

    /// Orders, duplicates and units of the row, read back from the database.
    /// Each logical order has a user of its own, so every order of a user
    /// beyond the first is a duplicate, whatever business id it got.
    pub(super) async fn count(
        &self,
        http: &reqwest::Client,
        ctx: &RowCtx,
    ) -> Result<Counts, StormError> {
        let mut c = Counts::default();
        for i in 0..ctx.logical {
            let user = ctx.user(i);
            let biz_ids: Vec<String> = match &self.db {
                Some(db) => db
                    .orders_of(&user)
                    .await?
                    .into_iter()
                    .map(|o| o.biz_id)
                    .collect(),
                None => {
                    let v: Value = http
                        .get(format!("{}/orders", self.bases[0]))
                        .header("x-user-id", &user)
                        .send()
                        .await
                        .map_err(|e| StormError::Target(e.to_string()))?
                        .json()
                        .await
                        .map_err(|e| StormError::Target(e.to_string()))?;
                    v["orders"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|o| o["bizId"].as_str().map(str::to_owned))
                                .collect()
                        })
                        .unwrap_or_default()
                }
            };
            c.created += biz_ids.len();
            c.duplicates += biz_ids.len().saturating_sub(1);
        }
        let units = match &self.db {
            Some(db) => db.units_ordered(&ctx.sku).await?,
            // Through the API: every storm order is for one unit.
            None => c.created as i64,
        };
        c.oversold = (units - ctx.logical as i64).max(0);
        Ok(c)
    }

    pub(super) async fn stop(self) {
        for g in self.gateways {
            g.stop().await;
        }
        for r in self.running {
            r.stop().await;
        }
    }
}

/// A row's damage, as the database has it.
#[derive(Debug, Default)]
pub(super) struct Counts {
    pub(super) created: usize,
    pub(super) duplicates: usize,
    pub(super) oversold: i64,
}
