//! The request id every request carries (`X-Request-Id`): the trusted
//! proxy's, or one the gateway makes; forwarded to the backend, given back
//! to the client and named in the access log.

use http::header::Entry;
use http::{HeaderMap, HeaderName, HeaderValue};

/// The header that names a request, forwarded to the backend and given
/// back to the client: the client's (or its proxy's) when it sent a
/// usable one, else one the gateway makes.
pub(crate) const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The request's id: the one it carries when it comes from a trusted
/// proxy (`trusted`) and is 1 to 200 visible ASCII characters, else a
/// fresh one ([`fresh_id`]), put in `headers` so the backend sees it.
pub(crate) fn request_id(headers: &mut HeaderMap, trusted: bool) -> HeaderValue {
    // One lookup of the name, for the read and the write.
    match headers.entry(REQUEST_ID) {
        Entry::Occupied(mut given) => {
            let count = given.iter().count();
            if keeps_given_id(given.get().as_bytes(), count, trusted) {
                return given.get().clone();
            }
            let id = fresh_id_value();
            // Every value the client sent goes: the first is replaced.
            given.insert(id.clone());
            id
        }
        Entry::Vacant(none) => none.insert(fresh_id_value()).clone(),
    }
}

/// A [`fresh_id`] as a header value.
pub(crate) fn fresh_id_value() -> HeaderValue {
    // Hex digits: always a valid value.
    HeaderValue::from_bytes(&fresh_id()).unwrap_or(HeaderValue::from_static("0"))
}

/// Whether the request id a request carries (`given`, the first of
/// `count`) is kept: it came from a trusted proxy, alone, 1 to 200
/// visible ASCII characters.
pub(crate) fn keeps_given_id(given: &[u8], count: usize, trusted: bool) -> bool {
    trusted && count == 1 && norepeat::identity::is_visible_ascii(given, 200)
}

/// A request id unique in this process and, with 64 random bits per
/// process, across processes: the process's random prefix and a counter,
/// 32 hex digits. No system call per request (a random id each was a
/// `getrandom` per request on the pass-through's hot path).
pub(crate) fn fresh_id() -> [u8; 32] {
    static PREFIX: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(|| {
        let mut raw = [0u8; 8];
        // No randomness (never seen on Linux): the process id and the
        // time still tell processes apart.
        if getrandom::fill(&mut raw).is_err() {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            return u64::from(std::process::id()) << 32 ^ (t as u64);
        }
        u64::from_le_bytes(raw)
    });
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // Not `format!`: its machinery cost more than the rest of the id.
    let mut raw = [0u8; 16];
    raw[..8].copy_from_slice(&prefix.to_be_bytes());
    raw[8..].copy_from_slice(&n.to_be_bytes());
    let mut id = [0u8; 32];
    let _ = hex::encode_to_slice(raw, &mut id);
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_usable_request_id_is_kept_and_any_other_replaced() {
        let mut h = HeaderMap::new();
        h.insert(REQUEST_ID, HeaderValue::from_static("abc-123"));
        assert_eq!(request_id(&mut h, true), "abc-123");
        let mut untrusted = h.clone();
        assert_ne!(
            request_id(&mut untrusted, false),
            "abc-123",
            "a client's own is replaced"
        );
        for bad in ["", "has space", &"x".repeat(201)] {
            let mut h = HeaderMap::new();
            h.insert(REQUEST_ID, HeaderValue::from_str(bad).unwrap());
            let id = request_id(&mut h, true);
            assert_eq!(id.len(), 32, "{bad:?}");
            assert_eq!(h[&REQUEST_ID], id, "the backend sees the new one");
        }
        let (a, b) = (fresh_id(), fresh_id());
        assert_ne!(a, b);
        assert_eq!(a[..16], b[..16], "one process, one prefix");
        let mut two = HeaderMap::new();
        two.append(REQUEST_ID, HeaderValue::from_static("a"));
        two.append(REQUEST_ID, HeaderValue::from_static("b"));
        assert_eq!(request_id(&mut two, true).len(), 32);
        assert_eq!(two.get_all(&REQUEST_ID).iter().count(), 1);
    }
}
