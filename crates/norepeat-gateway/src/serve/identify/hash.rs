//! The identity hash: what a caller's source value becomes before any
//! guard sees it, so no session id or bearer token is stored or logged as
//! it is.

/// The domain of the identity hash (a fixed key: the hash names a caller,
/// it is not a secret).
pub(super) const KEY: &[u8; 32] = b"norepeat-gateway identity v1 ...";

/// `"{kind}:"` and the keyed hash of `parts`, NUL-separated (one part
/// hashes as it is, the spelling of the release before `cookie` and `jwt`
/// for a header, keeping its records).
pub(crate) fn hashed(kind: &str, parts: &[&[u8]]) -> String {
    // One part (every source but a JWT's claim) is hashed at once: a
    // streaming `Hasher` is a 1.9 KB value, set up and moved for a value
    // of a few bytes (with the hex written in place: 2.36k -> 1.84k
    // instructions a call by callgrind, once per guarded request).
    let hash = match parts {
        [one] => blake3::keyed_hash(KEY, one),
        _ => {
            let mut h = blake3::Hasher::new_keyed(KEY);
            for (i, p) in parts.iter().enumerate() {
                if i > 0 {
                    h.update(b"\0");
                }
                h.update(p);
            }
            h.finalize()
        }
    };
    let mut hex = [0u8; 32];
    hex::encode_to_slice(&hash.as_bytes()[..16], &mut hex).expect("32 digits for 16 bytes");
    // Room for the site's scope too (`@` and 16 digits, `scope.rs`), so
    // that appending it does not move the string.
    let mut id = String::with_capacity(kind.len() + 33 + 17);
    id.push_str(kind);
    id.push(':');
    id.push_str(std::str::from_utf8(&hex).expect("hex digits are ASCII"));
    id
}
