//! `NOREPEAT_FAIL_FIRST_EVENT` (**test hook**, never set in production):
//! makes the first event this process handles fail once, before the effect
//! or after it (before the acknowledgement).

use std::sync::atomic::{AtomicBool, Ordering};

/// The test hook of `NOREPEAT_FAIL_FIRST_EVENT`.
#[derive(Debug)]
pub(super) enum FailHook {
    Off,
    Before(AtomicBool),
    After(AtomicBool),
}

impl FailHook {
    pub(super) fn from_env() -> Self {
        match std::env::var("NOREPEAT_FAIL_FIRST_EVENT").as_deref() {
            Ok("1" | "before") => FailHook::Before(AtomicBool::new(true)),
            Ok("after") => FailHook::After(AtomicBool::new(true)),
            _ => FailHook::Off,
        }
    }
    pub(super) fn before(&self) -> bool {
        matches!(self, FailHook::Before(armed) if armed.swap(false, Ordering::SeqCst))
    }
    pub(super) fn after(&self) -> bool {
        matches!(self, FailHook::After(armed) if armed.swap(false, Ordering::SeqCst))
    }
}
