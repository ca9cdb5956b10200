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
//!
//! The `gateway` defence (with `--redis`) runs naive shops behind two
//! `norepeat-gateway` processes that share that Redis, on a file that
//! guards `POST /orders` by token, `POST /orders/quick` by fingerprint and
//! `POST /payments` by `Idempotency-Key` (see `gateway`); the clients take
//! their page tokens from the gateway (`GET /.norepeat/token`), `lb-failover`
//! alternates the two gateways, and `redelivery` reaches the shops over HTTP
//! through the gateways (a message consumer inside the shop is past any
//! gateway). The storm does not take the gateways' Redis down, so
//! `store-outage` and `token-outage` run there without the outage, as
//! against `--target` shops.
//!
//! The parts: `args` (options), `scenarios` (how each scenario's repeats
//! arrive), `harness` (a row's context, timed requests and deliveries, the
//! driver), `shops` (the shops, their database, the damage counted back),
//! `gateway` (the gateway processes' file; the processes are the test kit's `GatewayProcess`), `report` (rows and
//! table), `faults` (the injected outages' log lines, counted), `error`.

mod args;
mod error;
mod faults;
mod gateway;
mod harness;
mod report;
mod scenarios;
mod shops;

pub use args::StormArgs;
pub use error::StormError;
pub use faults::{FAULT_TARGETS, Hidden, InjectedFaults};
pub use report::{Row, table};

use crate::config::Defence;
use crate::order_messages::OrderConsumer;
use harness::{RowCtx, Sample};
use indicatif::{ProgressBar, ProgressStyle};
use norepeat::store::AnyStore;
use scenarios::{SCENARIOS, copies, logical_order};
use shops::{Shops, TempDb};
use std::sync::Arc;
use std::time::Duration;

/// Every defence `--defence` names, in the table's order.
pub const DEFENCES: [&str; 5] = ["naive", "db", "guard+db", "full", "gateway"];

/// What one set of rows runs against.
#[derive(Debug, Clone, Copy)]
enum Setup {
    /// Shops started here with these defences.
    Shop(Defence),
    /// Naive shops behind gateways.
    Gateway,
    /// The `--target` shops.
    Target,
}

impl Setup {
    fn name(self) -> &'static str {
        match self {
            Setup::Shop(d) => d.name(),
            Setup::Gateway => "gateway",
            Setup::Target => "target",
        }
    }

    fn named(name: &str) -> Option<Self> {
        Some(match name {
            "naive" => Setup::Shop(Defence::Naive),
            "db" => Setup::Shop(Defence::Db),
            "guard+db" => Setup::Shop(Defence::GuardDb),
            "full" => Setup::Shop(Defence::Full),
            "gateway" => Setup::Gateway,
            _ => return None,
        })
    }
}

/// The setups of this run: the `--target` shops, or the `--defence`s (by
/// default every one, `gateway` only with a Redis for its instances).
fn setups(args: &StormArgs) -> Result<Vec<Setup>, StormError> {
    if !args.targets.is_empty() {
        if !args.defences.is_empty() {
            return Err(StormError::Target(
                "--defence does not apply to --target shops (they run their own)".into(),
            ));
        }
        return Ok(vec![Setup::Target]);
    }
    let redis = args.redis_url.as_deref().is_some_and(|u| !u.is_empty());
    let wanted: Vec<&str> = if args.defences.is_empty() {
        if !redis {
            eprintln!(
                "storm: the gateway rows are left out: its two instances need a Redis to share (--redis URL)"
            );
        }
        DEFENCES
            .into_iter()
            .filter(|d| *d != "gateway" || redis)
            .collect()
    } else {
        DEFENCES
            .into_iter()
            .filter(|d| args.defences.iter().any(|a| a == d))
            .collect()
    };
    if wanted.contains(&"gateway") && !redis {
        return Err(StormError::Gateway(
            "its two instances need a Redis to share: give --redis URL (or REDIS_URL)".into(),
        ));
    }
    Ok(wanted.into_iter().filter_map(Setup::named).collect())
}

/// Runs the storm; returns the rows and whether every defended row is clean.
/// The store outages it injects are announced to `faults`; at the end, one
/// info line says what they logged (see [`InjectedFaults`]).
///
/// # Errors
/// When shops cannot be started or the database cannot be read.
pub async fn run(args: StormArgs, faults: &InjectedFaults) -> Result<(Vec<Row>, bool), StormError> {
    let run_id: u32 = rand::random_range(0..1_000_000);
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| StormError::Target(e.to_string()))?;
    let defences = setups(&args)?;
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
        let n = args.instances.max(1);
        let shops = match (defence, args.redis_url.as_deref()) {
            (Setup::Shop(d), _) => Shops::start(*d, n, &temp_db.url, &store).await?,
            (Setup::Gateway, Some(redis)) => {
                Shops::behind_gateways(n, &temp_db.url, &store, redis).await?
            }
            (Setup::Gateway, None) => {
                return Err(StormError::Gateway("no Redis".into()));
            }
            (Setup::Target, _) => Shops::targets(&args, &temp_db.url).await?,
        };
        for (s_index, scenario) in SCENARIOS.iter().enumerate() {
            bar.set_message(format!("{scenario} / {}", defence.name()));
            let logical = ((args.requests as f64 / copies(scenario)).round() as usize).max(2);
            let ctx = Arc::new(RowCtx {
                http: http.clone(),
                bases: shops.bases.clone(),
                consumers: if shops.via_gateway() {
                    Vec::new()
                } else {
                    shops
                        .running
                        .iter()
                        .map(|r| OrderConsumer::of(&r.state))
                        .collect()
                },
                token_path: if shops.via_gateway() {
                    "/.norepeat/token"
                } else {
                    "/repeat/token"
                },
                host: shops.via_gateway().then_some("shop.storm.example"),
                prefix: format!("st{run_id}-{d_index}{s_index}"),
                sku: format!("STORM-{run_id}-{d_index}{s_index}"),
                logical,
                bar: bar.clone(),
            });
            shops
                .stock(&http, &ctx.sku, logical as i64, args.admin_token.as_deref())
                .await?;
            let samples = drive(scenario, &ctx, &shops, faults).await;
            shops.set_outage(false);
            let counts = shops.count(&http, &ctx).await?;
            // An outage lasts, for its log, until the breakers it opened
            // have closed: their closing is its doing too.
            if shops.breakers_closed() {
                faults.end();
            }
            rows.push(report::row(
                scenario,
                defence.name(),
                &ctx,
                &samples,
                counts,
            ));
        }
        shops.stop().await;
        faults.end();
    }
    bar.finish_and_clear();
    if let Some(summary) = faults.summary() {
        tracing::info!(
            "the store outages the storm injected logged, counted instead of printed: {summary}"
        );
    }
    let clean = rows
        .iter()
        .filter(|r| r.defence != "naive")
        .all(|r| r.duplicates == 0 && r.oversold == 0);
    Ok((rows, clean))
}

/// Sends a row's logical orders, half a millisecond apart, and collects
/// every sample (taking the store down when the scenario says).
async fn drive(
    scenario: &'static str,
    ctx: &Arc<RowCtx>,
    shops: &Shops,
    faults: &InjectedFaults,
) -> Vec<Sample> {
    let half = ctx.logical / 2;
    if scenario == "token-outage" {
        faults.begin();
        shops.set_outage(true);
    }
    let mut tasks = Vec::new();
    for i in 0..ctx.logical {
        if scenario == "store-outage" && i == half {
            // Let the first half land, then the store dies mid-storm.
            tokio::time::sleep(Duration::from_millis(50)).await;
            faults.begin();
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
