//! The load driver: a row's context, one request or message delivery
//! timed as a sample, and the logical orders of a scenario spread over
//! time.

use crate::order_messages::{ConsumeError, Delivered, OrderConsumer, OrderMessage};
use indicatif::ProgressBar;
use serde_json::{Value, json};

use std::time::Instant;

/// What every request of one row shares.
pub(super) struct RowCtx {
    pub(super) http: reqwest::Client,
    pub(super) bases: Vec<String>,
    /// The instances' order-message consumers (in-process shops only).
    pub(super) consumers: Vec<OrderConsumer>,
    /// Where a page token is taken: the shop's `/repeat/token`, or the
    /// gateway's `/.norepeat/token`.
    pub(super) token_path: &'static str,
    /// The `Host` every request names behind the gateways: one site, as
    /// a load balancer in front of them passes it (the gateway scopes its
    /// keys by site, so each gateway's own `127.0.0.1:PORT` would make the
    /// two instances two sites). `None`: the address requested.
    pub(super) host: Option<&'static str>,
    pub(super) prefix: String,
    pub(super) sku: String,
    pub(super) logical: usize,
    pub(super) bar: ProgressBar,
}

impl RowCtx {
    pub(super) fn user(&self, i: usize) -> String {
        format!("{}-{i}", self.prefix)
    }
    pub(super) fn base(&self, i: usize) -> &str {
        &self.bases[i % self.bases.len()]
    }
    pub(super) fn body(&self, i: usize) -> Value {
        json!({"sku": self.sku, "quantity": 1, "bizId": format!("b{i}")})
    }
}

/// One request's outcome.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sample {
    pub(super) status: u16,
    pub(super) ms: f64,
}

/// One request to a shop, timed.
pub(super) async fn send(
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
    if let Some(host) = ctx.host {
        req = req.header(reqwest::header::HOST, host);
    }
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
pub(super) async fn deliver(ctx: &RowCtx, consumer: &OrderConsumer, msg: &OrderMessage) -> Sample {
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

/// A repeat token from the shop (or gateway) at `base` for `user`.
pub(super) async fn token(ctx: &RowCtx, base: &str, user: &str) -> Option<String> {
    let mut req = ctx
        .http
        .get(format!("{base}{}", ctx.token_path))
        .header("x-user-id", user);
    if let Some(host) = ctx.host {
        req = req.header(reqwest::header::HOST, host);
    }
    let v: Value = req.send().await.ok()?.json().await.ok()?;
    v["repeatToken"].as_str().map(str::to_owned)
}
