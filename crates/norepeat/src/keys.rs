// Over 400 lines on purpose: 120 are its unit and property tests, and the key layout reads best whole.
//! Store keys: short, injective, one key per operation.
//!
//! A key is `prefix:` + `namespace` + `tag`:
//! - `prefix` names the application (default `nr`), so several can share a
//!   Redis;
//! - `namespace` is one letter: `t` token, `f` a window (the fingerprint
//!   guard's, the attribute's window mode's, the webhook layer's remembered
//!   signatures), `i` idempotency, `r` rate limit;
//! - `tag` is the first bits of BLAKE3 over the key's *scope* (tenant or
//!   user, method, concrete request path) and its *content* (fingerprint,
//!   client key), in base64url: 16 characters (96 bits) for tokens,
//!   idempotency records and rate limits, 10 characters (60 bits) for a
//!   window's key ([`Namespace::tag_chars`]).
//!
//! With the default prefix a fingerprint key is 14 bytes (`nr:fAbCdEfGhIj`)
//! and every other key 20 (`nr:iAbCdEfGhIjKlMnOp`).
//!
//! **Why a fingerprint key is shorter.** On Redis 7.0 (jemalloc) a key
//! name lives in an allocation of 1 + length + 1 bytes: up to 14 bytes
//! that is 16, from 15 to 30 bytes 32. A key with a TTL then costs about
//! 118 bytes in all at 14 bytes, 134 at 15 to 30 (BENCHMARKS.md has the
//! measurement). Window keys are the guard's bulk: one per request in the
//! window. They live for a window (a fingerprint's 3 s by default; a
//! remembered webhook signature twice the tolerance and a second, 601 s by
//! default), and a collision of two of them only makes a different request
//! look like a repeat for the rest of a window (a 409 or a `Duplicate`,
//! nothing stored or replayed). With `n` live fingerprint keys, a
//! new request meets an unrelated one with probability `n / 2^60`: below
//! one in a million million at a million live keys. Records that are kept
//! for a day (idempotency) or that carry a use (tokens) keep 96 bits.
//!
//! **Injective.** The parts are length-prefixed before hashing, so a user id
//! containing `:`, `{` or `}` can never produce the same input as another
//! user's. The key itself reads back unambiguously from its end: base64url
//! has no `:`, so the last `:` ends the prefix, the letter after it is the
//! namespace, and the rest is the tag, whose length the namespace fixes. So two keys
//! are equal only if prefix, namespace and tag are. 96 bits keep a collision
//! between two live keys of one namespace unlikely below about 2^48 keys, 60
//! bits below about 2^30.
//!
//! **No hash tag.** Every store operation touches one key (each Lua script
//! in `store/redis/lua/` reads and writes `KEYS[1]` only), so Redis Cluster can
//! place every key where its whole name hashes; no `{...}` is needed, and
//! none is written. A future operation that touches two keys must give
//! both the same hash tag. The prefix may not contain `{` or `}`, so it can
//! never form a hash tag by accident (base64url has neither).
//!
//! **Changing the layout between deployments.** A release that changes a
//! key's layout makes new keys for the same requests. For fingerprint keys
//! that lasts one window: while old and new instances serve side by side,
//! a repeat that reaches one of each is not stopped at the door (the
//! database's unique keys still stop its effect). Keep the prefix and the
//! release the same across a fleet when that matters.
//!
//! The key string of [`#[norepeat::guard]`](macro@crate::guard) is made the
//! same way: [`KeyParts`] length-prefixes each literal segment of its
//! template and each formatted argument, so `"{user}/{id}"` keeps user
//! `a/b` with id `c` apart from user `a` with id `b/c`.
//!
//! ```
//! use norepeat::keys::{KeyBuilder, Namespace};
//! let keys = KeyBuilder::new("shop");
//! let a = keys.key(Namespace::Fingerprint, &[b"user:1", b"POST", b"/orders"]);
//! let b = keys.key(Namespace::Fingerprint, &[b"user", b"1:POST", b"/orders"]);
//! assert_ne!(a, b);
//! assert!(a.starts_with("shop:f"));
//! assert_eq!(a.len(), "shop:f".len() + Namespace::Fingerprint.tag_chars());
//! assert_eq!(KeyBuilder::default().key(Namespace::Fingerprint, &[b"n"]).len(), 14);
//! assert_eq!(KeyBuilder::default().key(Namespace::Token, &[b"n"]).len(), 20);
//! ```

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use std::sync::Arc;

/// The most digest bytes a key reads: 96 bits, 16 base64url characters.
const TAG_BYTES: usize = 12;

/// What a key is for (its namespace): one letter in the key, so the keys
/// of two capabilities never meet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Namespace {
    /// A used one-time token.
    Token,
    /// A window: a request fingerprint's, the attribute's window mode's,
    /// a remembered webhook signature's.
    Fingerprint,
    /// An `Idempotency-Key` record.
    Idempotency,
    /// A rate limiter's state.
    RateLimit,
}

impl Namespace {
    /// The letter this namespace has in a key.
    #[must_use]
    pub const fn letter(self) -> char {
        match self {
            Namespace::Token => 't',
            Namespace::Fingerprint => 'f',
            Namespace::Idempotency => 'i',
            Namespace::RateLimit => 'r',
        }
    }

    /// The base64url characters of digest a key of this namespace keeps: 10
    /// (60 bits) for [`Namespace::Fingerprint`], 16 (96 bits) for the others.
    /// The [module docs](self) say why.
    ///
    /// ```
    /// use norepeat::keys::Namespace;
    /// assert_eq!(Namespace::Fingerprint.tag_chars(), 10);
    /// assert_eq!(Namespace::Idempotency.tag_chars(), 16);
    /// ```
    #[must_use]
    pub const fn tag_chars(self) -> usize {
        match self {
            Namespace::Fingerprint => 10,
            Namespace::Token | Namespace::Idempotency | Namespace::RateLimit => 16,
        }
    }
}

/// Builds the keys of one application.
#[derive(Debug, Clone)]
pub struct KeyBuilder {
    prefix: Arc<str>,
}

impl Default for KeyBuilder {
    /// Prefix `nr`.
    fn default() -> Self {
        Self::new("nr")
    }
}

impl KeyBuilder {
    /// Keys starting with `prefix:`. Keep it short: every key carries it.
    ///
    /// # Panics
    /// If `prefix` contains `{` or `}`, which would make a Redis Cluster
    /// hash tag and put every key in one slot.
    #[must_use]
    pub fn new(prefix: &str) -> Self {
        assert!(
            !prefix.contains(['{', '}']),
            "a key prefix must not contain '{{' or '}}'"
        );
        Self {
            prefix: Arc::from(prefix),
        }
    }

    /// The prefix.
    #[must_use]
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The key for `parts` (scope first, content last) in `namespace`.
    #[must_use]
    pub fn key(&self, namespace: Namespace, parts: &[&[u8]]) -> String {
        let mut h = Feed::new();
        parts_into(&mut h, parts);
        self.key_for_digest(namespace, h.finalize().as_bytes())
    }

    /// The key for a digest computed elsewhere: its first
    /// [`namespace.tag_chars()`](Namespace::tag_chars) × 6 bits are used (96 or 60).
    /// A digest shorter than 12 bytes gives a shorter tag.
    #[must_use]
    pub fn key_for_digest(&self, namespace: Namespace, digest: &[u8]) -> String {
        let tag = &digest[..digest.len().min(TAG_BYTES)];
        // 12 bytes encode to exactly 16 characters; the first `n` of them
        // are the digest's first 6n bits.
        let mut encoded = [0u8; 16];
        let len = URL_SAFE_NO_PAD
            .encode_slice(tag, &mut encoded)
            .unwrap_or(0)
            .min(namespace.tag_chars());
        let mut key = String::with_capacity(self.prefix.len() + 2 + len);
        key.push_str(&self.prefix);
        key.push(':');
        key.push(namespace.letter());
        // base64url is ASCII: one char per byte.
        key.extend(encoded[..len].iter().map(|&b| char::from(b)));
        key
    }
}

/// Feeds `parts` to `h`, each preceded by its length (8 bytes, little
/// endian) and the whole preceded by the count, which makes the byte stream
/// an injective function of the list.
pub fn feed_parts(h: &mut blake3::Hasher, parts: &[&[u8]]) {
    parts_into(h, parts);
}

/// [`feed_parts`] into any [`Absorb`].
pub(crate) fn parts_into(h: &mut impl Absorb, parts: &[&[u8]]) {
    h.absorb_len(parts.len());
    for p in parts {
        h.absorb_len(p.len());
        h.absorb(p);
    }
}

/// What a hash input is written to: a [`blake3::Hasher`], or a [`Feed`].
pub(crate) trait Absorb {
    /// Appends `bytes`.
    fn absorb(&mut self, bytes: &[u8]);

    /// Appends `n` as 8 bytes, little endian.
    fn absorb_len(&mut self, n: usize) {
        self.absorb(&(n as u64).to_le_bytes());
    }
}

impl Absorb for blake3::Hasher {
    fn absorb(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
}

/// The bytes of one BLAKE3 hash, gathered before the hash sees them.
///
/// A key's or a fingerprint's input is a few dozen short pieces (each
/// part and its length) of a few hundred bytes in all: fed one by one to
/// a [`blake3::Hasher`], each piece paid the hasher's bookkeeping, about
/// 1.4k instructions of an idempotent request's 41k (BENCHMARKS.md, issue
/// 39). Gathered here, up to one BLAKE3 chunk (1 KiB), they are hashed by
/// one call; a longer input goes on through a hasher. Either way the
/// digest is that of the same byte stream.
pub(crate) struct Feed {
    buf: [u8; FEED_BYTES],
    len: usize,
    /// Past [`FEED_BYTES`]: the hasher the input goes on through.
    spilled: Option<Box<blake3::Hasher>>,
}

/// One BLAKE3 chunk.
const FEED_BYTES: usize = 1024;

impl Feed {
    /// An empty input.
    pub(crate) fn new() -> Self {
        Self {
            buf: [0; FEED_BYTES],
            len: 0,
            spilled: None,
        }
    }

    /// The hash of everything absorbed; called once, the feed is then
    /// spent. (By reference, so that the feed's kilobyte is not copied
    /// to be hashed.)
    pub(crate) fn finalize(&mut self) -> blake3::Hash {
        let rest = &self.buf[..self.len];
        match self.spilled.as_mut() {
            None => blake3::hash(rest),
            Some(h) => {
                h.update(rest);
                h.finalize()
            }
        }
    }
}

impl Absorb for Feed {
    fn absorb(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        if let Some(room) = self.buf.get_mut(self.len..end) {
            room.copy_from_slice(bytes);
            self.len = end;
            return;
        }
        let h = self
            .spilled
            .get_or_insert_with(|| Box::new(blake3::Hasher::new()));
        h.update(&self.buf[..self.len]);
        self.len = 0;
        h.update(bytes);
    }

    fn absorb_len(&mut self, n: usize) {
        let end = self.len + 8;
        match self.buf.get_mut(self.len..end) {
            Some(room) => {
                room.copy_from_slice(&(n as u64).to_le_bytes());
                self.len = end;
            }
            None => self.absorb(&(n as u64).to_le_bytes()),
        }
    }
}

/// The byte stream [`feed_parts`] hashes, for tests and audits.
#[must_use]
pub fn encode_parts(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + parts.iter().map(|p| p.len() + 8).sum::<usize>());
    out.extend_from_slice(&(parts.len() as u64).to_le_bytes());
    for p in parts {
        out.extend_from_slice(&(p.len() as u64).to_le_bytes());
        out.extend_from_slice(p);
    }
    out
}

/// Builds the key of [`#[norepeat::guard]`](macro@crate::guard) from its
/// parts: each literal segment of the template and each formatted
/// argument, every one preceded by its length in bytes and a `:`.
///
/// The result is injective: two different lists of parts never give the
/// same key, whatever characters the arguments hold. With the template
/// `"{user}/{id}"`, user `a/b` with id `c` and user `a` with id `b/c`
/// formatted and joined would both read `a/b/c`; as parts they differ.
///
/// The attribute expands its template to calls of this builder; it is
/// public so that a test or a tool can name the key a call will use.
///
/// ```
/// use norepeat::keys::KeyParts;
/// let (user, id) = ("a/b", "c");
/// let one = KeyParts::new()
///     .arg(format_args!("{user}"))
///     .literal("/")
///     .arg(format_args!("{id}"))
///     .finish();
/// let (user, id) = ("a", "b/c");
/// let other = KeyParts::new()
///     .arg(format_args!("{user}"))
///     .literal("/")
///     .arg(format_args!("{id}"))
///     .finish();
/// assert_ne!(one, other);
/// assert_eq!(one, "3:a/b1:/1:c");
/// assert_eq!(one, norepeat::keys::key_from_parts(&["a/b", "/", "c"]));
/// ```
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct KeyParts {
    key: String,
    scratch: String,
}

impl KeyParts {
    /// An empty key.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a literal segment of the template.
    pub fn literal(mut self, text: &str) -> Self {
        self.push(text);
        self
    }

    /// Appends an argument, formatted as the template asks
    /// (`format_args!("{}", order.id)`, `format_args!("{:?}", id)`).
    pub fn arg(mut self, value: std::fmt::Arguments<'_>) -> Self {
        use std::fmt::Write as _;
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        // Writing to a `String` fails only if a `Display` impl reports an
        // error it did not get from the writer; keep what it wrote.
        let _ = scratch.write_fmt(value);
        self.push(&scratch);
        self.scratch = scratch;
        self
    }

    fn push(&mut self, part: &str) {
        use std::fmt::Write as _;
        let _ = write!(self.key, "{}:", part.len());
        self.key.push_str(part);
    }

    /// The key.
    #[must_use]
    pub fn finish(self) -> String {
        self.key
    }
}

/// The key [`KeyParts`] builds from `parts`, all given as text.
///
/// ```
/// use norepeat::keys::key_from_parts;
/// assert_ne!(key_from_parts(&["a/b", "/", "c"]), key_from_parts(&["a", "/", "b/c"]));
/// ```
#[must_use]
pub fn key_from_parts(parts: &[&str]) -> String {
    parts
        .iter()
        .fold(KeyParts::new(), |k, p| k.literal(p))
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Two different lists of parts never encode to the same bytes.
        #[test]
        fn encoding_is_injective(
            a in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..8), 0..5),
            b in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..8), 0..5),
        ) {
            let ra: Vec<&[u8]> = a.iter().map(Vec::as_slice).collect();
            let rb: Vec<&[u8]> = b.iter().map(Vec::as_slice).collect();
            prop_assert_eq!(a == b, encode_parts(&ra) == encode_parts(&rb));
        }

        /// User ids made of the separators used elsewhere still give distinct keys.
        #[test]
        fn separators_in_user_ids_do_not_collide(
            u1 in "[a-z:{}]{0,6}", u2 in "[a-z:{}]{0,6}", r1 in "[a-z:/{}]{0,6}", r2 in "[a-z:/{}]{0,6}"
        ) {
            let k = KeyBuilder::default();
            let a = k.key(Namespace::Fingerprint, &[u1.as_bytes(), r1.as_bytes()]);
            let b = k.key(Namespace::Fingerprint, &[u2.as_bytes(), r2.as_bytes()]);
            prop_assert_eq!(u1 == u2 && r1 == r2, a == b);
        }
    }

    #[test]
    fn streaming_and_buffered_encodings_agree() {
        let parts: [&[u8]; 3] = [b"u", b"", b"POST"];
        let mut h = blake3::Hasher::new();
        feed_parts(&mut h, &parts);
        assert_eq!(h.finalize(), blake3::hash(&encode_parts(&parts)));
    }

    proptest! {
        /// A [`Feed`] hashes what a hasher fed piece by piece hashes, on
        /// either side of its buffer's size and across it.
        #[test]
        fn a_feed_hashes_the_same_stream(
            pieces in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..700), 0..6)
        ) {
            let mut feed = Feed::new();
            let mut hasher = blake3::Hasher::new();
            for p in &pieces {
                feed.absorb_len(p.len());
                feed.absorb(p);
                hasher.update(&(p.len() as u64).to_le_bytes());
                hasher.update(p);
            }
            prop_assert_eq!(feed.finalize(), hasher.finalize());
        }
    }

    proptest! {
        /// Two different lists of parts never make the same attribute key.
        #[test]
        fn key_parts_are_injective(
            a in proptest::collection::vec("[a-z0-9:/{}]{0,4}", 0..5),
            b in proptest::collection::vec("[a-z0-9:/{}]{0,4}", 0..5),
        ) {
            let ra: Vec<&str> = a.iter().map(String::as_str).collect();
            let rb: Vec<&str> = b.iter().map(String::as_str).collect();
            prop_assert_eq!(a == b, key_from_parts(&ra) == key_from_parts(&rb));
        }
    }

    #[test]
    fn key_parts_format_arguments_as_asked() {
        let key = KeyParts::new()
            .literal("order:")
            .arg(format_args!("{:?}", "a b"))
            .arg(format_args!("{:>3}", 7))
            .finish();
        assert_eq!(key, "6:order:5:\"a b\"3:  7");
    }

    #[test]
    fn keys_are_twenty_bytes_and_carry_no_hash_tag() {
        let k = KeyBuilder::default().key(Namespace::Idempotency, &[&[7u8; 300]]);
        assert_eq!(k.len(), 20);
        assert!(k.starts_with("nr:i"));
        assert!(!k.contains(['{', '}']));
        let digest = [0xffu8; 32];
        let d = KeyBuilder::default().key_for_digest(Namespace::Token, &digest);
        assert_eq!(d, "nr:t________________");
    }

    #[test]
    fn fingerprint_keys_are_fourteen_bytes_of_the_first_sixty_bits() {
        let mut digest = [0u8; 32];
        digest[..8].copy_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xf0]);
        let k = KeyBuilder::default().key_for_digest(Namespace::Fingerprint, &digest);
        assert_eq!(k, "nr:f__________");
        // Bits past the 60th do not change the key.
        digest[7] = 0xff;
        digest[11] = 0x01;
        assert_eq!(
            KeyBuilder::default().key_for_digest(Namespace::Fingerprint, &digest),
            k
        );
        // Bit 60 (the last one kept) does.
        digest[7] = 0xe0;
        assert_ne!(
            KeyBuilder::default().key_for_digest(Namespace::Fingerprint, &digest),
            k
        );
        assert_eq!(
            KeyBuilder::default()
                .key(Namespace::Fingerprint, &[b"u", b"POST"])
                .len(),
            14
        );
    }

    proptest! {
        /// Keys of different prefixes, namespaces or tags never meet, even when a
        /// prefix ends like another's namespace (`a` + `f` against `a:f` + `t`).
        #[test]
        fn keys_are_injective_across_prefixes_and_namespaces(
            p1 in "[a-z:]{0,4}", p2 in "[a-z:]{0,4}",
            m1 in 0usize..4, m2 in 0usize..4,
            d1 in proptest::collection::vec(any::<u8>(), 12), d2 in proptest::collection::vec(any::<u8>(), 12),
        ) {
            let namespaces = [Namespace::Token, Namespace::Fingerprint, Namespace::Idempotency, Namespace::RateLimit];
            let a = KeyBuilder::new(&p1).key_for_digest(namespaces[m1], &d1);
            let b = KeyBuilder::new(&p2).key_for_digest(namespaces[m2], &d2);
            // What a key of the namespace keeps: 96 bits, or 60 for fingerprints.
            let kept = |m: usize, d: &[u8]| -> u128 {
                let mut v = [0u8; 16];
                v[..12].copy_from_slice(d);
                u128::from_be_bytes(v) >> (128 - 6 * namespaces[m].tag_chars())
            };
            prop_assert_eq!(p1 == p2 && m1 == m2 && kept(m1, &d1) == kept(m2, &d2), a == b);
        }
    }
}
