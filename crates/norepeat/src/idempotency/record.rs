//! The record an `Idempotency-Key` holds in the store, as compact bytes.
//!
//! ```text
//! in progress: version(1) state=1(1) owner(16) fingerprint(16)
//! completed:   version(1) state=2(1) owner(16) fingerprint(16)
//!              status(u16) header_count(u16)
//!              { name_len(u16) name  value_len(u32) value } * header_count
//!              body (the rest)
//! ```
//!
//! Integers are big endian. The in-progress record is exactly 34 bytes and
//! unique per claim (the owner is random), so the store's compare-and-set
//! on the whole value is the fence: only the request that wrote these bytes
//! can renew, release or complete them. Binary, not JSON with base64: a
//! replayed body is stored as is, without a third more bytes or a decode
//! step.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};

const VERSION: u8 = 1;
const IN_PROGRESS: u8 = 1;
const COMPLETED: u8 = 2;
const HEAD: usize = 2 + 16 + 16;

/// Who wrote a record: 128 random bits per claim.
pub(crate) type Owner = [u8; 16];

/// The part of the request fingerprint a record keeps (128 bits).
pub(crate) type Digest = [u8; 16];

/// A decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) owner: Owner,
    pub(crate) fingerprint: Digest,
    /// `None` while the first request is still running.
    pub(crate) completed: Option<Completed>,
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

/// The 34 bytes of an in-progress record.
pub(crate) fn in_progress(owner: &Owner, fingerprint: &Digest) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEAD);
    out.extend_from_slice(&[VERSION, IN_PROGRESS]);
    out.extend_from_slice(owner);
    out.extend_from_slice(fingerprint);
    out
}

/// A completed record. Headers whose name or value do not fit the length
/// fields (64 KiB, 4 GiB) are left out rather than truncated.
pub(crate) fn completed<'a>(
    owner: &Owner,
    fingerprint: &Digest,
    status: StatusCode,
    headers: impl IntoIterator<Item = (&'a HeaderName, &'a HeaderValue)>,
    body: &[u8],
) -> Vec<u8> {
    let headers: Vec<(&[u8], &[u8], u16, u32)> = headers
        .into_iter()
        .filter_map(|(n, v)| {
            let name = n.as_str().as_bytes();
            let value = v.as_bytes();
            Some((
                name,
                value,
                u16::try_from(name.len()).ok()?,
                u32::try_from(value.len()).ok()?,
            ))
        })
        .take(usize::from(u16::MAX))
        .collect();
    let size = HEAD
        + 4
        + headers
            .iter()
            .map(|(n, v, ..)| 6 + n.len() + v.len())
            .sum::<usize>()
        + body.len();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&[VERSION, COMPLETED]);
    out.extend_from_slice(owner);
    out.extend_from_slice(fingerprint);
    out.extend_from_slice(&status.as_u16().to_be_bytes());
    // At most u16::MAX headers were taken above.
    let count = u16::try_from(headers.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&count.to_be_bytes());
    for (name, value, name_len, value_len) in headers {
        out.extend_from_slice(&name_len.to_be_bytes());
        out.extend_from_slice(name);
        out.extend_from_slice(&value_len.to_be_bytes());
        out.extend_from_slice(value);
    }
    out.extend_from_slice(body);
    out
}

/// Decodes a record; the body shares `bytes`' buffer.
pub(crate) fn decode(bytes: &Bytes) -> Result<Record, Malformed> {
    let mut r = Reader { buf: bytes, at: 0 };
    if r.take(1)? != [VERSION] {
        return Err(Malformed("unknown version"));
    }
    let state = r.take(1)?[0];
    let owner = r.array16()?;
    let fingerprint = r.array16()?;
    let completed = match state {
        IN_PROGRESS if r.at == bytes.len() => None,
        IN_PROGRESS => return Err(Malformed("trailing bytes after an in-progress record")),
        COMPLETED => {
            let status = StatusCode::from_u16(r.u16()?).map_err(|_| Malformed("bad status"))?;
            let count = r.u16()?;
            let mut headers = Vec::with_capacity(usize::from(count));
            for _ in 0..count {
                let name_len = usize::from(r.u16()?);
                let name = HeaderName::from_bytes(r.take(name_len)?)
                    .map_err(|_| Malformed("bad header name"))?;
                let value_len =
                    usize::try_from(r.u32()?).map_err(|_| Malformed("header too long"))?;
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
        completed,
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
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn in_progress_round_trips_and_is_34_bytes() {
        let b = in_progress(&[1; 16], &[2; 16]);
        assert_eq!(b.len(), 34);
        let r = decode(&Bytes::from(b)).unwrap();
        assert_eq!(r.owner, [1; 16]);
        assert_eq!(r.fingerprint, [2; 16]);
        assert!(r.completed.is_none());
    }

    #[test]
    fn completed_round_trips() {
        let ct = (
            HeaderName::from_static("content-type"),
            HeaderValue::from_static("application/json"),
        );
        let loc = (
            HeaderName::from_static("location"),
            HeaderValue::from_static("/payments/1"),
        );
        let body = b"{\"a\":1}\x00\xff";
        let b = completed(
            &[3; 16],
            &[4; 16],
            StatusCode::CREATED,
            [(&ct.0, &ct.1), (&loc.0, &loc.1)],
            body,
        );
        let r = decode(&Bytes::from(b)).unwrap();
        let c = r.completed.unwrap();
        assert_eq!(c.status, StatusCode::CREATED);
        assert_eq!(c.headers, vec![ct, loc]);
        assert_eq!(&c.body[..], body);
    }

    #[test]
    fn rejects_what_it_does_not_understand() {
        assert!(decode(&Bytes::new()).is_err());
        assert!(decode(&Bytes::from_static(b"{\"json\":true}")).is_err());
        let mut b = in_progress(&[0; 16], &[0; 16]);
        b[0] = 9;
        assert!(decode(&Bytes::from(b)).is_err());
        let mut b = in_progress(&[0; 16], &[0; 16]);
        b.push(0);
        assert!(decode(&Bytes::from(b)).is_err());
        let h = (
            HeaderName::from_static("etag"),
            HeaderValue::from_static("\"x\""),
        );
        let b = completed(&[0; 16], &[0; 16], StatusCode::OK, [(&h.0, &h.1)], b"");
        assert!(decode(&Bytes::from(b[..b.len() - 1].to_vec())).is_err());
    }

    proptest! {
        /// Any body and status survive the trip; any cut of a completed
        /// record's head is refused, never misread.
        #[test]
        fn bodies_round_trip(body in proptest::collection::vec(any::<u8>(), 0..512), status in 200u16..600) {
            let status = StatusCode::from_u16(status).unwrap();
            let b = completed(&[7; 16], &[8; 16], status, [], &body);
            let c = decode(&Bytes::from(b.clone())).unwrap().completed.unwrap();
            prop_assert_eq!(c.status, status);
            prop_assert_eq!(&c.body[..], &body[..]);
            for cut in 0..HEAD + 4 {
                prop_assert!(decode(&Bytes::from(b[..cut].to_vec())).is_err());
            }
        }
    }
}
