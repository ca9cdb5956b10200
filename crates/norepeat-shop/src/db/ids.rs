//! Small value helpers: generated ids, timestamps and hex encoding.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub(super) fn now_ms() -> i64 {
    unix_ms(SystemTime::now())
}

/// `t` in milliseconds since the Unix epoch (0 before it).
pub(super) fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// `prefix` followed by 128 random bits in hex.
pub(super) fn new_id(prefix: &str) -> String {
    format!("{prefix}{:032x}", rand::random::<u128>())
}

/// Lower-case hex of `bytes`.
pub(super) fn hex_encode(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The 32 bytes of a 64-character hex string, `None` if it is not one.
pub(super) fn hex_decode_32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(s.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    Some(out)
}
