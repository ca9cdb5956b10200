//! The shop's data, as the HTTP contract and the database both know it:
//! orders and payments, their life cycles, and the limits on what a client
//! may ask for. Routes check requests against these limits and the database
//! layer refuses anything outside them, both from here.

use std::fmt;
use std::ops::RangeInclusive;

use serde::Serialize;

/// Largest payment amount, in minor units (cents).
pub const MAX_PAYMENT_AMOUNT: i64 = 10_000_000;

/// The payment amounts the shop takes, in minor units (cents).
///
/// ```
/// use norepeat_shop::domain::{MAX_PAYMENT_AMOUNT, PAYMENT_AMOUNTS};
///
/// assert!(PAYMENT_AMOUNTS.contains(&1));
/// assert!(!PAYMENT_AMOUNTS.contains(&(MAX_PAYMENT_AMOUNT + 1)));
/// ```
pub const PAYMENT_AMOUNTS: RangeInclusive<i64> = 1..=MAX_PAYMENT_AMOUNT;

/// The units one order may ask for.
pub const ORDER_QUANTITIES: RangeInclusive<i64> = 1..=100;

/// Why an amount outside [`PAYMENT_AMOUNTS`] is refused, or `None` for one
/// inside: the one check behind every way a payment is written.
///
/// ```
/// use norepeat_shop::domain::amount_refusal;
///
/// assert_eq!(amount_refusal(100), None);
/// assert_eq!(
///     amount_refusal(0).as_deref(),
///     Some("amount must be between 1 and 10000000, got 0")
/// );
/// ```
#[must_use]
pub fn amount_refusal(amount: i64) -> Option<String> {
    (!PAYMENT_AMOUNTS.contains(&amount)).then(|| {
        format!(
            "amount must be between {} and {}, got {amount}",
            PAYMENT_AMOUNTS.start(),
            PAYMENT_AMOUNTS.end()
        )
    })
}

/// The life cycle of an order.
///
/// Allowed transitions: `UNPAID -> PAID`, `PAID -> COMPLETED`, `UNPAID -> CANCELLED`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, Hash, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OrderStatus {
    /// Created, waiting for payment.
    Unpaid,
    /// Paid (a payment succeeded).
    Paid,
    /// Delivered / closed after payment.
    Completed,
    /// Cancelled before payment.
    Cancelled,
}

impl OrderStatus {
    /// The stored and serialised name: `UNPAID`, `PAID`, `COMPLETED` or `CANCELLED`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unpaid => "UNPAID",
            Self::Paid => "PAID",
            Self::Completed => "COMPLETED",
            Self::Cancelled => "CANCELLED",
        }
    }

    /// Parses the stored name (exact, upper case).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "UNPAID" => Some(Self::Unpaid),
            "PAID" => Some(Self::Paid),
            "COMPLETED" => Some(Self::Completed),
            "CANCELLED" => Some(Self::Cancelled),
            _ => None,
        }
    }

    /// Whether `self -> to` is in the state machine's table.
    pub fn can_transition_to(self, to: OrderStatus) -> bool {
        matches!(
            (self, to),
            (Self::Unpaid, Self::Paid)
                | (Self::Paid, Self::Completed)
                | (Self::Unpaid, Self::Cancelled)
        )
    }
}

impl fmt::Display for OrderStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The life cycle of a payment: `PENDING -> SUCCEEDED` or `PENDING -> FAILED`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, Hash, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PaymentStatus {
    /// Created, waiting for the provider's notice.
    Pending,
    /// The provider reported success.
    Succeeded,
    /// The provider reported failure.
    Failed,
}

impl PaymentStatus {
    /// The stored and serialised name: `PENDING`, `SUCCEEDED` or `FAILED`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::Succeeded => "SUCCEEDED",
            Self::Failed => "FAILED",
        }
    }

    /// Parses the stored name (exact, upper case).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "PENDING" => Some(Self::Pending),
            "SUCCEEDED" => Some(Self::Succeeded),
            "FAILED" => Some(Self::Failed),
            _ => None,
        }
    }
}

impl fmt::Display for PaymentStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An order, serialised exactly as the HTTP contract:
/// `{"orderId","bizId","userId","sku","quantity","status"}`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Order {
    /// Server-generated id (`ord_...`).
    pub order_id: String,
    /// The client's business id (or a generated `biz_...`); unique per user.
    pub biz_id: String,
    /// The buyer.
    pub user_id: String,
    /// The product.
    pub sku: String,
    /// Units ordered.
    pub quantity: i64,
    /// Current state.
    pub status: OrderStatus,
}

/// A payment, serialised as `{"paymentId","orderId","amount","status"}`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Payment {
    /// Server-generated id (`pay_...`).
    pub payment_id: String,
    /// The order paid for.
    pub order_id: String,
    /// Amount in minor units (cents).
    pub amount: i64,
    /// Current state.
    pub status: PaymentStatus,
}
