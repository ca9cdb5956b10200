//! The wall clock in milliseconds, for the values a guard writes (a
//! token's expiry, a fingerprint owner's deadline), and [`Clock`], the
//! seam through which a test sets it.
//!
//! ```
//! use norepeat::clock::Clock;
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU64, Ordering};
//! // A clock the test moves by hand: any `Fn() -> u64` is a clock.
//! let now = Arc::new(AtomicU64::new(1_000));
//! let clock = { let now = Arc::clone(&now); move || now.load(Ordering::SeqCst) };
//! now.fetch_add(500, Ordering::SeqCst);
//! assert_eq!(clock.now_ms(), 1_500);
//! ```

use std::time::{SystemTime, UNIX_EPOCH};

/// Where wall-clock time comes from: milliseconds since the Unix epoch.
///
/// [`SystemClock`] in production; any `Fn() -> u64` (a closure over an
/// atomic, say) in tests that need two instances whose clocks differ.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

impl<F> Clock for F
where
    F: Fn() -> u64 + Send + Sync + 'static,
{
    fn now_ms(&self) -> u64 {
        self()
    }
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        now_ms()
    }
}

/// Milliseconds since the Unix epoch: 0 for a clock set before it, and
/// `u64::MAX` past what 64 bits hold (some 584 million years), so a
/// deadline computed from it saturates instead of wrapping.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
