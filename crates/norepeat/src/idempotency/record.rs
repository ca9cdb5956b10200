// Over 400 lines on purpose: the record's bytes, every version written and read in one place, so a change of layout is seen whole.
//! The record an `Idempotency-Key` holds in the store, as compact bytes.
//!
//! ```text
//! written:
//! in progress: version=4(1) state=1(1) fingerprint(3) owner(2) attempt(1)
//!              deadline(4: the lease's end, hundredths of a second
//!              since the Unix epoch, modulo 2^32)
//! released:    as in progress, state=3
//! unknown:     as in progress, state=4, then status(u16): the status
//!              the client was told
//! completed:   version=2(1) state=2(1) fingerprint(16)
//!              status(u16) header_count(u8)
//!              { name  value_len(u16) value } * header_count
//!              body (the rest)
//!   name: name_len(u8, 1..=255) name, or 0 and an index(u8) into
//!         WELL_KNOWN (the layer's default allow-list, in a fixed order)
//!
//! still read, no longer written:
//! in progress, version 3: version=3(1) state=1(1) fingerprint(4) owner(6)
//! in progress, version 2: version=2(1) state=1(1) fingerprint(16) owner(10)
//! version 1: in progress: version=1(1) state=1(1) owner(16) fingerprint(16)
//!            completed:   version=1(1) state=2(1) owner(16) fingerprint(16)
//!                         status(u16) header_count(u16)
//!                         { name_len(u16) name  value_len(u32) value } * header_count
//!                         body (the rest)
//! ```
//!
//! Integers are big endian. The first byte is the version, the second the
//! state; a version this code does not know is refused, never guessed at.
//!
//! The in-progress record is 12 bytes and unique per claim and renewal
//! (16 random bits of the claim's owner, its attempt number and its lease
//! deadline to the hundredth of a second), so the store's compare-and-set
//! on the whole value is the fence: only the request that wrote these
//! bytes can renew, release or complete them. A renewal writes the record
//! again with a later deadline (owner-checked, one compare-and-set), so the
//! deadline in the record says whether its owner still lives: a record
//! whose deadline has passed was abandoned (its process died, or lost its
//! store for a whole lease), and its outcome is unknown. The record itself
//! lives for the retention, so an abandoned claim is not forgotten when
//! its lease ends. It keeps 24 bits of the request's fingerprint, enough to
//! tell a different request under the same key (422) from a retry of this
//! one (409) while the first still runs; a completed record keeps all 128,
//! which decide whether a retry is replayed.
//!
//! The deadline is kept modulo 2^32 hundredths of a second (497 days) and
//! compared as a signed difference, so a record is read right for 248 days
//! either side of now; one abandoned for longer reads as running (409
//! `idempotency_key_in_use`): refused either way, never run again. The
//! attempt number is 1 for the first claim and one more at each take-over
//! of an abandoned claim (see `Abandoned::Retry`), up to 255. A completed record keeps
//! no owner: nothing is fenced on it (a completion replaces the in-progress
//! bytes, and a completed record is only read, replayed and left to
//! expire); it decodes with an all-zero owner. Binary, not JSON with
//! base64: a replayed body is stored as is, without a third more bytes or a
//! decode step.
//!
//! Why these widths, measured by `norepeat bench` on Redis 7.0
//! (BENCHMARKS.md): Redis keeps a value of up to 44 bytes in one allocation
//! with its object header (16 + 3 + length + 1 bytes), so 12 bytes fill a
//! 32-byte jemalloc class where version 2's 28 took 48 and version 1's 34
//! took 64: 149 bytes per in-progress key in all, against 165 and 181.
//! Version 4 keeps the 12 bytes of version 3 by giving the deadline and
//! the attempt 5 of them: one byte of fingerprint and four of owner fewer
//! (the deadline, new at every claim and renewal, does the owner's work of
//! keeping two claims' bytes apart). A
//! longer value lives in a separate allocation of 3 + length + 1 bytes: a
//! completed record of a 64-byte JSON body with its `content-type` is 105
//! bytes in version 2 (a 112-byte class) against 136 in version 1 (160);
//! naming `content-type` by its index saves the 11 bytes that keep it under
//! 112. Header names over 255 bytes, values over 64 KiB and headers past
//! the 255th are left out rather than truncated; the layer's allow-list
//! stores a handful of short headers.
//!
//! A response whose body is not kept (over the cap, an event stream,
//! trailers, a body that broke) is a completed version-2 record with an
//! empty body and one more header, `idempotent-body: omitted`, spelled out:
//! not a flag and not a new version, so a release that knew nothing of it
//! replays it the same way (status, headers, that header, no body).
//!
//! **Between deployments.** Every version here is read, so a release that
//! writes version 4 reads what the ones before it left (in progress or
//! completed), and a rolling deploy forgets nothing. An in-progress record
//! of version 3 or older carries no deadline: it blocks (409) for as long
//! as it lives, which was the lease it was written with. A release that cannot
//! read version 4 (before this one) refuses such a record as malformed
//! while it sees one, that is only while a request claimed by a newer
//! instance is still running; it then answers as its store-failure policy
//! says (503 `guard_unavailable` when closed).

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};

const VERSION_1: u8 = 1;
/// The version of a completed record as written now (and of a version-2
/// in-progress one, still read).
const VERSION_2: u8 = 2;
/// The version of an in-progress record of the release before this one
/// (still read: no deadline).
const VERSION_3: u8 = 3;
/// The version of an in-progress record as written now.
const VERSION_4: u8 = 4;
const IN_PROGRESS: u8 = 1;
const COMPLETED: u8 = 2;
/// A version-4 in-progress record's layout, written when its request ended
/// without an outcome to keep (a 5xx the policy does not store): the key's
/// next request runs, as the next attempt.
const RELEASED: u8 = 3;
/// A version-4 in-progress record's layout and the status its client was
/// told, written when its request ended with an outcome nobody knows (see
/// [`OutcomeUnknown`](super::OutcomeUnknown)): kept for the retention, and
/// every repeat is refused (409 `idempotency_outcome_unknown`).
const UNKNOWN: u8 = 4;
/// Random bits of the owner a version-2 in-progress record keeps, in bytes.
const OWNER_BYTES_V2: usize = 10;
/// Random bits of the owner a version-3 in-progress record keeps, in bytes.
const OWNER_BYTES_V3: usize = 6;
/// Bits of the fingerprint a version-3 in-progress record keeps, in bytes.
const FINGERPRINT_BYTES_V3: usize = 4;
/// Random bits of the owner a version-4 in-progress record keeps, in bytes.
const OWNER_BYTES_V4: usize = 2;
/// Bits of the fingerprint a version-4 in-progress record keeps, in bytes.
const FINGERPRINT_BYTES_V4: usize = 3;
/// Where a version-4 record's deadline starts (its last 4 bytes).
const DEADLINE_AT_V4: usize = 2 + FINGERPRINT_BYTES_V4 + OWNER_BYTES_V4 + 1;
/// Version, state and fingerprint: what every version-2 record starts with.
const HEAD: usize = 2 + 16;

/// Header names a version-2 record writes as one index byte. Part of the
/// format: append only, never reorder.
const WELL_KNOWN: [HeaderName; 8] = [
    http::header::CONTENT_TYPE,
    http::header::CONTENT_ENCODING,
    http::header::CONTENT_LANGUAGE,
    http::header::CONTENT_LOCATION,
    http::header::LOCATION,
    http::header::ETAG,
    http::header::LAST_MODIFIED,
    http::header::LINK,
];

/// Who wrote a record: 128 random bits per claim (an in-progress record
/// keeps 48).
pub(crate) type Owner = [u8; 16];

/// The part of the request fingerprint a record keeps (128 bits).
pub(crate) type Digest = [u8; 16];

/// A decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// The bits of the owner the record keeps, the rest zero (all zero in a
    /// version-2 completed record).
    pub(crate) owner: Owner,
    /// The bytes of the fingerprint the record keeps, the rest zero: see
    /// [`fingerprint_len`](Self::fingerprint_len).
    pub(crate) fingerprint: Digest,
    /// How many leading bytes of `fingerprint` the record kept: 16, 4 in a
    /// version-3 in-progress record, 3 in a version-4 one.
    pub(crate) fingerprint_len: usize,
    /// The claim's attempt and lease deadline: in a version-4 in-progress
    /// record only (older ones carry none).
    pub(crate) lease: Option<Lease>,
    /// `None` while the first request is still running.
    pub(crate) completed: Option<Completed>,
    /// Released ([`released`]): the next request takes the key over as
    /// attempt `lease.attempt + 1`, whatever its body.
    pub(crate) released: bool,
    /// An unknown outcome ([`unknown`]): the status the client was told.
    pub(crate) unknown: Option<StatusCode>,
}

/// The attempt number and the lease deadline of an in-progress record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lease {
    /// 1 for the first claim, one more at each take-over.
    pub(crate) attempt: u8,
    /// The lease's end ([`crate::claim::stamp`]).
    pub(crate) deadline: u32,
}

impl Record {
    /// Whether `fingerprint` is the request this record was written for,
    /// as far as the record can tell (the bytes it kept).
    pub(crate) fn is_for(&self, fingerprint: &Digest) -> bool {
        self.fingerprint[..self.fingerprint_len] == fingerprint[..self.fingerprint_len]
    }
}

/// A stored response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Completed {
    pub(crate) status: StatusCode,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    pub(crate) body: Bytes,
}

/// The bytes are not a record this version understands.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed idempotency record: {0}")]
pub(crate) struct Malformed(&'static str);

/// The 12 bytes of an in-progress record (version 4): claim number
/// `attempt`, whose lease ends at `deadline_ms` (wall clock).
pub(crate) fn in_progress(
    owner: &Owner,
    fingerprint: &Digest,
    attempt: u8,
    deadline_ms: u64,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(DEADLINE_AT_V4 + 4);
    out.extend_from_slice(&[VERSION_4, IN_PROGRESS]);
    out.extend_from_slice(&fingerprint[..FINGERPRINT_BYTES_V4]);
    out.extend_from_slice(&owner[..OWNER_BYTES_V4]);
    out.push(attempt.max(1));
    out.extend_from_slice(&crate::claim::stamp(deadline_ms).to_be_bytes());
    out
}

/// `claimed` (a version-4 in-progress record) marked released: its request
/// ended with nothing kept, so the next request with the key runs, and is
/// told it is the next attempt (`Idempotency-Attempt`), as the backend may
/// have seen this one. `None` for any other record.
pub(crate) fn released(claimed: &[u8]) -> Option<Vec<u8>> {
    if claimed.len() != DEADLINE_AT_V4 + 4 || claimed[..2] != [VERSION_4, IN_PROGRESS] {
        return None;
    }
    let mut out = claimed.to_vec();
    out[1] = RELEASED;
    Some(out)
}

/// The record of attempt `attempt`, whose outcome is unknown (its client
/// was told `status`): kept for the retention, every repeat refused.
pub(crate) fn unknown(
    owner: &Owner,
    fingerprint: &Digest,
    attempt: u8,
    status: StatusCode,
) -> Vec<u8> {
    let mut out = in_progress(owner, fingerprint, attempt, 0);
    out[1] = UNKNOWN;
    out.extend_from_slice(&status.as_u16().to_be_bytes());
    out
}

/// `claimed` (a version-4 in-progress record) with its lease deadline moved
/// to `deadline_ms`: what a renewal writes. `None` for any other record.
pub(crate) fn restamp(claimed: &[u8], deadline_ms: u64) -> Option<Vec<u8>> {
    if claimed.len() != DEADLINE_AT_V4 + 4 || claimed[..2] != [VERSION_4, IN_PROGRESS] {
        return None;
    }
    let mut out = claimed.to_vec();
    out[DEADLINE_AT_V4..].copy_from_slice(&crate::claim::stamp(deadline_ms).to_be_bytes());
    Some(out)
}

/// A completed record (no owner: see the module docs). Headers whose name
/// or value do not fit the length fields (255 bytes, 64 KiB), and headers
/// past the 255th, are left out rather than truncated.
pub(crate) fn completed<'a>(
    _owner: &Owner,
    fingerprint: &Digest,
    status: StatusCode,
    headers: impl IntoIterator<Item = (&'a HeaderName, &'a HeaderValue)>,
    body: &[u8],
) -> Vec<u8> {
    let headers: Vec<(Name<'_>, &[u8], u16)> = headers
        .into_iter()
        .filter_map(|(n, v)| {
            let name = match WELL_KNOWN.iter().position(|w| w == n) {
                Some(i) => Name::Known(u8::try_from(i).ok()?),
                None => {
                    let bytes = n.as_str().as_bytes();
                    Name::Literal(bytes, u8::try_from(bytes.len()).ok()?)
                }
            };
            let value = v.as_bytes();
            Some((name, value, u16::try_from(value.len()).ok()?))
        })
        .take(usize::from(u8::MAX))
        .collect();
    let size = HEAD
        + 3
        + headers
            .iter()
            .map(|(n, v, _)| n.encoded_len() + 2 + v.len())
            .sum::<usize>()
        + body.len();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&[VERSION_2, COMPLETED]);
    out.extend_from_slice(fingerprint);
    out.extend_from_slice(&status.as_u16().to_be_bytes());
    // At most u8::MAX headers were taken above.
    let count = u8::try_from(headers.len()).unwrap_or(u8::MAX);
    out.push(count);
    for (name, value, value_len) in headers {
        match name {
            Name::Known(i) => out.extend_from_slice(&[0, i]),
            Name::Literal(bytes, len) => {
                out.push(len);
                out.extend_from_slice(bytes);
            }
        }
        out.extend_from_slice(&value_len.to_be_bytes());
        out.extend_from_slice(value);
    }
    out.extend_from_slice(body);
    out
}

/// The response header that marks a replay whose body was not kept
/// (`Idempotent-Body: omitted`): the first response was a success the
/// store could not hold (over the cap, an event stream, trailers, or a body
/// that broke half-way), so the outcome is replayed without it.
pub const IDEMPOTENT_BODY: HeaderName = HeaderName::from_static("idempotent-body");

/// The headers that describe a body, left out of a record without one.
fn describes_the_body(name: &HeaderName) -> bool {
    [
        http::header::CONTENT_TYPE,
        http::header::CONTENT_ENCODING,
        http::header::CONTENT_LANGUAGE,
    ]
    .contains(name)
}

/// A completed record of a response whose body is not kept: its status,
/// the given headers but those describing the body, no body, and the
/// header `Idempotent-Body: omitted`, which a replay sends as it is.
///
/// No flag and no new version: this is a version-2 completed record with
/// one more header, spelled out (not a [`WELL_KNOWN`] index, which a
/// release before this one would refuse). So every release that reads
/// version 2, this one and those before it, replays it alike and never
/// runs the handler again.
pub(crate) fn completed_without_body<'a>(
    owner: &Owner,
    fingerprint: &Digest,
    status: StatusCode,
    headers: impl IntoIterator<Item = (&'a HeaderName, &'a HeaderValue)>,
) -> Vec<u8> {
    let headers = headers
        .into_iter()
        .filter(|(n, _)| !describes_the_body(n) && **n != IDEMPOTENT_BODY)
        .chain(std::iter::once((&IDEMPOTENT_BODY_NAME, &OMITTED)));
    completed(owner, fingerprint, status, headers, &[])
}

/// [`IDEMPOTENT_BODY`] and its value as statics, to lend out.
static IDEMPOTENT_BODY_NAME: HeaderName = IDEMPOTENT_BODY;
static OMITTED: HeaderValue = HeaderValue::from_static("omitted");

/// A header name as a version-2 record writes it.
enum Name<'a> {
    /// An index into [`WELL_KNOWN`].
    Known(u8),
    /// The name and its length.
    Literal(&'a [u8], u8),
}

impl Name<'_> {
    fn encoded_len(&self) -> usize {
        match self {
            Name::Known(_) => 2,
            Name::Literal(b, _) => 1 + b.len(),
        }
    }
}

/// Decodes a record of any version; the body shares `bytes`' buffer.
pub(crate) fn decode(bytes: &Bytes) -> Result<Record, Malformed> {
    let mut r = Reader { buf: bytes, at: 0 };
    let version = r.take(1)?[0];
    let state = r.take(1)?[0];
    let mut owner = [0; 16];
    let mut fingerprint_len = 16;
    let mut lease = None;
    let fingerprint = match version {
        VERSION_4 if matches!(state, IN_PROGRESS | RELEASED | UNKNOWN) => {
            let mut fingerprint = [0; 16];
            fingerprint[..FINGERPRINT_BYTES_V4].copy_from_slice(r.take(FINGERPRINT_BYTES_V4)?);
            fingerprint_len = FINGERPRINT_BYTES_V4;
            owner[..OWNER_BYTES_V4].copy_from_slice(r.take(OWNER_BYTES_V4)?);
            let attempt = r.u8()?;
            let deadline = r.u32()?;
            lease = Some(Lease { attempt, deadline });
            fingerprint
        }
        VERSION_4 => return Err(Malformed("a version-4 record is only ever a claim")),
        VERSION_3 if state == IN_PROGRESS => {
            let mut fingerprint = [0; 16];
            fingerprint[..FINGERPRINT_BYTES_V3].copy_from_slice(r.take(FINGERPRINT_BYTES_V3)?);
            fingerprint_len = FINGERPRINT_BYTES_V3;
            owner[..OWNER_BYTES_V3].copy_from_slice(r.take(OWNER_BYTES_V3)?);
            fingerprint
        }
        VERSION_3 => return Err(Malformed("a version-3 record is only ever in progress")),
        VERSION_2 => {
            let fingerprint = r.array16()?;
            if state == IN_PROGRESS {
                owner[..OWNER_BYTES_V2].copy_from_slice(r.take(OWNER_BYTES_V2)?);
            }
            fingerprint
        }
        VERSION_1 => {
            owner = r.array16()?;
            r.array16()?
        }
        _ => return Err(Malformed("unknown version")),
    };
    let unknown = if version == VERSION_4 && state == UNKNOWN {
        Some(StatusCode::from_u16(r.u16()?).map_err(|_| Malformed("bad status"))?)
    } else {
        None
    };
    let completed = match state {
        IN_PROGRESS | RELEASED | UNKNOWN if r.at == bytes.len() => None,
        IN_PROGRESS | RELEASED | UNKNOWN => {
            return Err(Malformed("trailing bytes after an in-progress record"));
        }
        COMPLETED => {
            let status = StatusCode::from_u16(r.u16()?).map_err(|_| Malformed("bad status"))?;
            let v1 = version == VERSION_1;
            let count = if v1 { r.u16()? } else { u16::from(r.u8()?) };
            let mut headers = Vec::with_capacity(usize::from(count));
            for _ in 0..count {
                let name_len = if v1 {
                    usize::from(r.u16()?)
                } else {
                    usize::from(r.u8()?)
                };
                let name = if name_len == 0 && !v1 {
                    WELL_KNOWN
                        .get(usize::from(r.u8()?))
                        .cloned()
                        .ok_or(Malformed("unknown header index"))?
                } else {
                    HeaderName::from_bytes(r.take(name_len)?)
                        .map_err(|_| Malformed("bad header name"))?
                };
                let value_len = if v1 {
                    usize::try_from(r.u32()?).map_err(|_| Malformed("header too long"))?
                } else {
                    usize::from(r.u16()?)
                };
                let value = HeaderValue::from_bytes(r.take(value_len)?)
                    .map_err(|_| Malformed("bad header value"))?;
                headers.push((name, value));
            }
            Some(Completed {
                status,
                headers,
                body: bytes.slice(r.at..),
            })
        }
        _ => return Err(Malformed("unknown state")),
    };
    Ok(Record {
        owner,
        fingerprint,
        fingerprint_len,
        lease,
        completed,
        released: version == VERSION_4 && state == RELEASED,
        unknown,
    })
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], Malformed> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or(Malformed("truncated"))?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn array16(&mut self) -> Result<[u8; 16], Malformed> {
        let mut a = [0; 16];
        a.copy_from_slice(self.take(16)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, Malformed> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, Malformed> {
        let s = self.take(2)?;
        Ok(u16::from_be_bytes([s[0], s[1]]))
    }

    fn u32(&mut self) -> Result<u32, Malformed> {
        let s = self.take(4)?;
        Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }
}

#[cfg(test)]
mod tests;
