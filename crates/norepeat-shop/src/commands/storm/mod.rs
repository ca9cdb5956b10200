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
//! The parts: `args` (options), `scenarios` (how each scenario's repeats
//! arrive), `harness` (a row's context, timed requests and deliveries, the
//! driver), `shops` (the shops, their database, the damage counted back),
//! `report` (rows and table), `error`.

mod args;
mod error;
mod harness;
mod report;
mod scenarios;
mod shops;

pub use args::StormArgs;
pub use error::StormError;
pub use report::{Row, table};

use crate::config::Defence;
use crate::order_messages::OrderConsumer;
use harness::{RowCtx, drive};
use indicatif::{ProgressBar, ProgressStyle};
use norepeat::store::AnyStore;
use scenarios::{SCENARIOS, copies};
use shops::{Shops, TempDb};
use std::sync::Arc;
use std::time::Duration;

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
                    .map(|r| OrderConsumer::of(&r.state))
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
            rows.push(report::row(
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
