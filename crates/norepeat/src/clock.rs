//! The wall clock in milliseconds, for the values a guard writes (a
//! token's expiry, a fingerprint owner's deadline).

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch: 0 for a clock set before it, and
/// `u64::MAX` past what 64 bits hold (some 584 million years), so a
/// deadline computed from it saturates instead of wrapping.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
