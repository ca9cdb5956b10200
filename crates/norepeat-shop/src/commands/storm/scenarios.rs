//! The scenarios: how each logical order's repeats arrive.

use super::harness::{RowCtx, Sample, deliver, send, token};
use crate::order_messages::OrderMessage;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// Every scenario, in the table's order.
pub(super) const SCENARIOS: [&str; 6] = [
    "double-click",
    "retry-after-timeout",
    "redelivery",
    "lb-failover",
    "store-outage",
    "token-outage",
];

/// Repeats each logical order causes in a scenario, on average.
pub(super) fn copies(scenario: &str) -> f64 {
    match scenario {
        "double-click" => 2.5,
        "retry-after-timeout" => 2.5,
        "redelivery" | "store-outage" | "token-outage" => 3.0,
        _ => 2.0,
    }
}

/// Sends one logical order's copies as the scenario says.
pub(super) async fn logical_order(
    scenario: &'static str,
    ctx: Arc<RowCtx>,
    i: usize,
) -> Vec<Sample> {
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
            if i.is_multiple_of(2) {
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
