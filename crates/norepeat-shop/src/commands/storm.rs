//! `norepeat storm`: replay the duplicate-submission incident against the
//! naive service and each layer of defence, and count the damage from the
//! database afterwards.
//!
//! Every scenario sends `L` logical orders, each from its own user with its
//! own business id, on a product stocked with exactly `L` units, as real
//! clients would resend them:
//!
//! | scenario | how the repeats arrive |
//! |---|---|
//! | `double-click` | 2 or 3 identical submits with the same page token, at once, to one instance |
//! | `retry-after-timeout` | the client framework times out and resends the identical request while the first still runs (and, for half, once more just after it answered) |
//! | `redelivery` | a broker delivers the same order message three times to the consumers of two instances (the shop's order-message consumer, `order_messages`; over HTTP against `--target` shops) |
//! | `lb-failover` | the load balancer resends the same submit to the other instance |
//! | `store-outage` | double clicks and resends to the other instance while the guard store dies half-way |
//! | `token-outage` | the guard store is down; one page token, no `bizId`, sent to both instances at once and resent to the second |
//!
//! `created`, `duplicates` (orders beyond one per logical order, whatever
//! their business ids: each logical order is its own user) and
//! `oversold` (units ordered beyond the stock) are read from the database
//! (with `--target` and no `--database`, through `GET /orders`, which reads
//! it). Against `--target` shops the storm cannot take their store down, so
//! `store-outage` and `token-outage` run without the outage there, and
//! `redelivery` reaches the shops over HTTP.
//!
//! `token-outage` is the case only the database can decide: with the store
//! down each instance admits the token once on its own, and an order without
//! a `bizId` is made single by the business key the shop derives from the
//! token.

use crate::app::AppState;
use crate::commands::serve::InProcess;
use crate::config::{Defence, ShopConfig};
use crate::db::Db;
use crate::events::Events;
use crate::order_messages::{ConsumeError, Delivered, OrderConsumer, OrderMessage};
use indicatif::{ProgressBar, ProgressStyle};
use norepeat::store::AnyStore;
use serde::Serialize;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The storm's options.
#[derive(Debug, Clone, clap::Args)]
pub struct StormArgs {
    /// Shop instances to start, sharing one store and one database.
    #[arg(long, default_value_t = 2)]
    pub instances: usize,
    /// Requests per row (scenario × defence), approximately.
    #[arg(long, default_value_t = 200)]
    pub requests: usize,
    /// Guard store shared by the instances (default: one in-process memory store).
    #[arg(long = "redis", env = "REDIS_URL")]
    pub redis_url: Option<String>,
    /// Database shared by the instances (default: a fresh SQLite file in the temp directory).
    #[arg(long = "database", env = "DATABASE_URL")]
    pub database_url: Option<String>,
    /// Shops already running (repeatable): drive them instead of starting
    /// shops. Needs `NOREPEAT_ADMIN_TOKEN` to stock the storm's product.
    #[arg(long = "target")]
    pub targets: Vec<String>,
    /// Admin token of the `--target` shops.
    #[arg(long, env = "NOREPEAT_ADMIN_TOKEN")]
    pub admin_token: Option<String>,
    /// Print one JSON object on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// One line of the result.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Scenario name.
    pub scenario: &'static str,
    /// `naive`, or the layers of defence.
    pub defence: String,
    /// Requests sent.
    pub sent: usize,
    /// Orders that should exist.
    pub expected: usize,
    /// Orders that exist.
    pub created: usize,
    /// Orders beyond one per logical order.
    pub duplicates: usize,
    /// Units ordered beyond the stock.
    pub oversold: i64,
    /// Requests answered 4xx (stopped at the door, or refused by the database).
    pub rejected: usize,
    /// Median latency.
    pub p50_ms: f64,
    /// 99th percentile latency.
    pub p99_ms: f64,
}

/// Why the storm could not run.
#[derive(Debug, thiserror::Error)]
pub enum StormError {
    /// Starting the shops failed.
    #[error("{0}")]
    Start(#[from] crate::app::StartError),
    /// The database failed.
    #[error("database: {0}")]
    Db(#[from] crate::db::DbError),
    /// A target shop misbehaved.
    #[error("{0}")]
    Target(String),
}

const SCENARIOS: [&str; 6] = [
    "double-click",
    "retry-after-timeout",
    "redelivery",
    "lb-failover",
    "store-outage",
    "token-outage",
];

/// Repeats each logical order causes in a scenario, on average.
fn copies(scenario: &str) -> f64 {
    match scenario {
        "double-click" => 2.5,
        "retry-after-timeout" => 2.5,
        "redelivery" | "store-outage" | "token-outage" => 3.0,
        _ => 2.0,
    }
}

/// Runs the storm; returns the rows and whether every defended row is clean.
///
/// # Errors
/// When shops cannot be started or the database cannot be read.
pub async fn run(args: StormArgs) -> Result<(Vec<Row>, bool), StormError> {
    let run_id: u32 = rand::random_range(0..1_000_000);
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| StormError::Target(e.to_string()))?;
    let defences: Vec<Option<Defence>> = if args.targets.is_empty() {
        vec![
            Some(Defence::Naive),
            Some(Defence::Db),
            Some(Defence::GuardDb),
            Some(Defence::Full),
        ]
    } else {
        vec![None]
    };
    let total = (SCENARIOS.len() * defences.len() * args.requests) as u64;
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template("{spinner} storm {bar:30} {pos}/{len} requests {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let temp_db = TempDb::new(args.database_url.as_deref());
    let store = AnyStore::from_url(args.redis_url.as_deref())
        .await
        .map_err(crate::app::StartError::from)?;

    let mut rows = Vec::new();
    for (d_index, defence) in defences.iter().enumerate() {
        let shops = match defence {
            Some(d) => Shops::start(*d, args.instances.max(1), &temp_db.url, &store).await?,
            None => Shops::targets(&args, &temp_db.url).await?,
        };
        for (s_index, scenario) in SCENARIOS.iter().enumerate() {
            bar.set_message(format!(
                "{scenario} / {}",
                defence.map_or("target", Defence::name)
            ));
            let logical = ((args.requests as f64 / copies(scenario)).round() as usize).max(2);
            let ctx = Arc::new(RowCtx {
                http: http.clone(),
                bases: shops.bases.clone(),
                consumers: shops
                    .running
                    .iter()
                    .map(|r| OrderConsumer::new(r.state.clone()))
                    .collect(),
                prefix: format!("st{run_id}-{d_index}{s_index}"),
                sku: format!("STORM-{run_id}-{d_index}{s_index}"),
                logical,
                bar: bar.clone(),
            });
            shops
                .stock(&http, &ctx.sku, logical as i64, args.admin_token.as_deref())
                .await?;
            let samples = drive(scenario, &ctx, &shops).await;
            shops.set_outage(false);
            let counts = shops.count(&http, &ctx).await?;
            rows.push(row(
                scenario,
                defence.map_or("target", Defence::name),
                &ctx,
                &samples,
                counts,
            ));
        }
        shops.stop().await;
    }
    bar.finish_and_clear();
    let clean = rows
        .iter()
        .filter(|r| r.defence != "naive")
        .all(|r| r.duplicates == 0 && r.oversold == 0);
    Ok((rows, clean))
}

/// The database the storm's own shops share, and whether it is a temp file.
struct TempDb {
    url: String,
    file: Option<std::path::PathBuf>,
}

impl TempDb {
    fn new(url: Option<&str>) -> Self {
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
struct Shops {
    bases: Vec<String>,
    running: Vec<InProcess>,
    db: Option<Db>,
}

impl Shops {
    async fn start(
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
            db,
        })
    }

    async fn targets(args: &StormArgs, db_url: &str) -> Result<Self, StormError> {
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
            db,
        })
    }

    async fn stock(
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

    fn set_outage(&self, down: bool) {
        for r in &self.running {
            r.state.outage.set_down(down);
        }
    }

    /// Orders, duplicates and units of the row, read back from the database.
    /// Each logical order has a user of its own, so every order of a user
    /// beyond the first is a duplicate, whatever business id it got.
    async fn count(&self, http: &reqwest::Client, ctx: &RowCtx) -> Result<Counts, StormError> {
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

    async fn stop(self) {
        for r in self.running {
            r.stop().await;
        }
    }
}

#[derive(Debug, Default)]
struct Counts {
    created: usize,
    duplicates: usize,
    oversold: i64,
}

struct RowCtx {
    http: reqwest::Client,
    bases: Vec<String>,
    /// The instances' order-message consumers (in-process shops only).
    consumers: Vec<OrderConsumer>,
    prefix: String,
    sku: String,
    logical: usize,
    bar: ProgressBar,
}

impl RowCtx {
    fn user(&self, i: usize) -> String {
        format!("{}-{i}", self.prefix)
    }
    fn base(&self, i: usize) -> &str {
        &self.bases[i % self.bases.len()]
    }
    fn body(&self, i: usize) -> Value {
        json!({"sku": self.sku, "quantity": 1, "bizId": format!("b{i}")})
    }
}

/// One request's outcome.
#[derive(Debug, Clone, Copy)]
struct Sample {
    status: u16,
    ms: f64,
}

async fn send(
    ctx: &RowCtx,
    base: &str,
    path: &str,
    user: &str,
    token: Option<&str>,
    body: &Value,
) -> Sample {
    let started = Instant::now();
    let mut req = ctx
        .http
        .post(format!("{base}{path}"))
        .header("x-user-id", user)
        .json(body);
    if let Some(t) = token {
        req = req.header("repeat-token", t);
    }
    let status = match req.send().await {
        Ok(res) => {
            let s = res.status().as_u16();
            let _ = res.bytes().await;
            s
        }
        Err(_) => 599,
    };
    ctx.bar.inc(1);
    Sample {
        status,
        ms: started.elapsed().as_secs_f64() * 1000.0,
    }
}

/// One delivery of an order message to an instance's consumer, as a status:
/// 201 placed, 200 already placed (acknowledged), 409 refused or in
/// progress elsewhere (not acknowledged: it comes again), 500 failed.
async fn deliver(ctx: &RowCtx, consumer: &OrderConsumer, msg: &OrderMessage) -> Sample {
    let started = Instant::now();
    let status = match consumer.handle(msg).await {
        Ok(Delivered::Placed(_)) => 201,
        Ok(Delivered::AlreadyPlaced(_)) => 200,
        Ok(Delivered::Refused) | Err(ConsumeError::Guard(_)) => 409,
        Err(ConsumeError::Db(_)) => 500,
    };
    ctx.bar.inc(1);
    Sample {
        status,
        ms: started.elapsed().as_secs_f64() * 1000.0,
    }
}

async fn token(ctx: &RowCtx, base: &str, user: &str) -> Option<String> {
    let v: Value = ctx
        .http
        .get(format!("{base}/repeat/token"))
        .header("x-user-id", user)
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    v["repeatToken"].as_str().map(str::to_owned)
}

/// Sends one logical order's copies as the scenario says.
async fn logical_order(scenario: &'static str, ctx: Arc<RowCtx>, i: usize) -> Vec<Sample> {
    let user = ctx.user(i);
    let body = ctx.body(i);
    // The instance the client talks to, and the other one (the same one
    // when there is only one).
    let a = ctx.base(i).to_owned();
    let b = ctx.base(i + 1).to_owned();
    let mut out = Vec::new();
    match scenario {
        "double-click" => {
            let t = token(&ctx, &a, &user).await;
            let n = 2 + i % 2;
            let copies = (0..n).map(|_| send(&ctx, &a, "/orders", &user, t.as_deref(), &body));
            out.extend(futures_util::future::join_all(copies).await);
        }
        "retry-after-timeout" => {
            let first = send(&ctx, &a, "/orders/quick", &user, None, &body);
            let retry = async {
                // The framework's timeout fires while the first is in flight.
                tokio::time::sleep(Duration::from_millis(2)).await;
                send(&ctx, &a, "/orders/quick", &user, None, &body).await
            };
            let (s1, s2) = tokio::join!(first, retry);
            out.extend([s1, s2]);
            if i % 2 == 0 {
                // ... and once more just after the answer got lost.
                out.push(send(&ctx, &a, "/orders/quick", &user, None, &body).await);
            }
        }
        "redelivery" if !ctx.consumers.is_empty() => {
            // The order message, delivered to the consumers of two instances
            // at once, and again after a missed ack: the shop's consumer path.
            let msg = OrderMessage {
                message_id: format!("b{i}"),
                user_id: user.clone(),
                sku: ctx.sku.clone(),
                quantity: 1,
            };
            let n = ctx.consumers.len();
            let (c1, c2) = (&ctx.consumers[i % n], &ctx.consumers[(i + 1) % n]);
            let (s1, s2) = tokio::join!(deliver(&ctx, c1, &msg), deliver(&ctx, c2, &msg));
            out.extend([s1, s2]);
            tokio::time::sleep(Duration::from_millis(20)).await;
            out.push(deliver(&ctx, c2, &msg).await);
        }
        "redelivery" => {
            // Against --target shops: the consumer calls the order API.
            let (s1, s2) = tokio::join!(
                send(&ctx, &a, "/orders/quick", &user, None, &body),
                send(&ctx, &b, "/orders/quick", &user, None, &body)
            );
            out.extend([s1, s2]);
            tokio::time::sleep(Duration::from_millis(20)).await;
            out.push(send(&ctx, &b, "/orders/quick", &user, None, &body).await);
        }
        "lb-failover" => {
            let t = token(&ctx, &a, &user).await;
            let resend = async {
                tokio::time::sleep(Duration::from_millis(2)).await;
                send(&ctx, &b, "/orders", &user, t.as_deref(), &body).await
            };
            let (s1, s2) = tokio::join!(
                send(&ctx, &a, "/orders", &user, t.as_deref(), &body),
                resend
            );
            out.extend([s1, s2]);
        }
        "token-outage" => {
            // The store is down for the whole row: each instance can only
            // remember its own admissions. No bizId: the token is the key.
            let body = json!({"sku": ctx.sku, "quantity": 1});
            let t = token(&ctx, &a, &user).await;
            let (s1, s2) = tokio::join!(
                send(&ctx, &a, "/orders", &user, t.as_deref(), &body),
                send(&ctx, &b, "/orders", &user, t.as_deref(), &body)
            );
            out.extend([s1, s2]);
            out.push(send(&ctx, &b, "/orders", &user, t.as_deref(), &body).await);
        }
        _ => {
            // store-outage: a double click to one instance and a resend to the other.
            let resend = async {
                tokio::time::sleep(Duration::from_millis(2)).await;
                send(&ctx, &b, "/orders/quick", &user, None, &body).await
            };
            let (s1, s2, s3) = tokio::join!(
                send(&ctx, &a, "/orders/quick", &user, None, &body),
                send(&ctx, &a, "/orders/quick", &user, None, &body),
                resend
            );
            out.extend([s1, s2, s3]);
        }
    }
    out
}

async fn drive(scenario: &'static str, ctx: &Arc<RowCtx>, shops: &Shops) -> Vec<Sample> {
    let half = ctx.logical / 2;
    if scenario == "token-outage" {
        shops.set_outage(true);
    }
    let mut tasks = Vec::new();
    for i in 0..ctx.logical {
        if scenario == "store-outage" && i == half {
            // Let the first half land, then the store dies mid-storm.
            tokio::time::sleep(Duration::from_millis(50)).await;
            shops.set_outage(true);
        }
        let ctx = Arc::clone(ctx);
        tasks.push(tokio::spawn(logical_order(scenario, ctx, i)));
        // Orders arrive over time, not all in one instant.
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    let mut samples = Vec::new();
    for t in tasks {
        if let Ok(s) = t.await {
            samples.extend(s);
        }
    }
    samples
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    (sorted[idx.min(sorted.len() - 1)] * 100.0).round() / 100.0
}

fn row(scenario: &'static str, defence: &str, ctx: &RowCtx, samples: &[Sample], c: Counts) -> Row {
    let mut ms: Vec<f64> = samples.iter().map(|s| s.ms).collect();
    ms.sort_by(f64::total_cmp);
    Row {
        scenario,
        defence: defence.to_owned(),
        sent: samples.len(),
        expected: ctx.logical,
        created: c.created,
        duplicates: c.duplicates,
        oversold: c.oversold,
        rejected: samples
            .iter()
            .filter(|s| (400..500).contains(&s.status))
            .count(),
        p50_ms: percentile(&ms, 0.5),
        p99_ms: percentile(&ms, 0.99),
    }
}

/// The table for people.
#[must_use]
pub fn table(rows: &[Row]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<20} {:<9} {:>5} {:>8} {:>7} {:>10} {:>8} {:>8} {:>8} {:>8}",
        "scenario",
        "defence",
        "sent",
        "expected",
        "created",
        "duplicates",
        "oversold",
        "rejected",
        "p50 ms",
        "p99 ms"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<20} {:<9} {:>5} {:>8} {:>7} {:>10} {:>8} {:>8} {:>8.1} {:>8.1}",
            r.scenario,
            r.defence,
            r.sent,
            r.expected,
            r.created,
            r.duplicates,
            r.oversold,
            r.rejected,
            r.p50_ms,
            r.p99_ms
        );
    }
    out
}
