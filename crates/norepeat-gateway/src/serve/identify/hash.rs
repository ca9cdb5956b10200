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
    let mut h = blake3::Hasher::new_keyed(KEY);
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            h.update(b"\0");
        }
        h.update(p);
    }
    let hex = h.finalize().to_hex();
    let mut id = String::with_capacity(kind.len() + 33);
    id.push_str(kind);
    id.push(':');
    id.push_str(&hex[..32]);
    id
}
