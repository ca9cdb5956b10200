//! Request bodies: reading one once, up to a cap ([`read`]), and the one
//! rule for which bodies are JSON ([`is_json`], [`kind`]).
//!
//! Every layer that reads a body (the fingerprint layer, idempotency, the
//! webhook verifier) reads it here, and an application can too: a
//! [`BodyError`] converts to the same [`Problem`](crate::problem::Problem)
//! (413 `payload_too_large` or 400 `invalid_request`) wherever it happens.
//!
//! # Which bodies are JSON
//! A body is JSON when its `Content-Type` says so (`application/json` or any
//! `type/x+json`, parameters allowed; not NDJSON or `json-seq`). It must
//! then be one strict JSON value, as [`Fingerprinter::canonicalize`]
//! reads it (RFC 8259, UTF-8, no key given twice in an object, at most 128
//! levels deep), else it is the client's error: 400 `invalid_request`. A
//! body without a content type, or with a generic one (`text/plain`, a
//! form), that starts like a JSON object or array is read as JSON if it is
//! strict JSON, else as bytes: a guard cannot call it malformed, since it
//! never claimed to be JSON. [`check_json`](crate::json::check_json) is the strictness test, for an
//! application that parses JSON bodies itself.
//!
//! ```
//! use norepeat::body::{self, BodyError};
//! use norepeat::problem::Problem;
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let headers = http::HeaderMap::new();
//! let small = http_body_util::Full::new(bytes::Bytes::from_static(b"{}"));
//! assert_eq!(body::read(small, 16, &headers).await.unwrap(), &b"{}"[..]);
//! let big = http_body_util::Full::new(bytes::Bytes::from(vec![b'x'; 17]));
//! let err = body::read(big, 16, &headers).await.unwrap_err();
//! assert!(matches!(err, BodyError::TooLarge { max: 16 }));
//! assert_eq!(Problem::from(err).code.status(), 413);
//! # }
//! ```
//!
//! [`Fingerprinter::canonicalize`]: crate::fingerprint::Fingerprinter::canonicalize

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::Body;
use http_body_util::BodyExt;

/// Why a request body could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BodyError {
    /// It is larger than `max` bytes (413 `payload_too_large`).
    #[error("the request body is larger than {max} bytes")]
    TooLarge {
        /// The cap it passed.
        max: usize,
    },
    /// The body stream failed (400 `invalid_request`).
    #[error("the request body could not be read: {0}")]
    Unreadable(String),
}

/// Whether the request's `Content-Length` says its body is over `max`:
/// then [`read`] refuses it before reading a byte, and a shadowed layer can
/// still hand the untouched body on. (A body that only turns out larger
/// while it is read cannot be handed on: the layer read part of it and did
/// not keep the rest; that one is refused with 413 even in shadow mode.)
///
/// A proxy that streams a body on can refuse it the same way before
/// sending a byte (the gateway's token and rate-limit routes do).
///
/// ```
/// use http::HeaderMap;
/// let mut h = HeaderMap::new();
/// assert!(!norepeat::body::declares_over(&h, 100)); // no length said
/// h.insert("content-length", "101".parse().unwrap());
/// assert!(norepeat::body::declares_over(&h, 100));
/// assert!(!norepeat::body::declares_over(&h, 101));
/// ```
pub fn declares_over(headers: &HeaderMap, max: usize) -> bool {
    headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > max as u64)
}

/// Reads the whole body, refusing it as soon as it passes `max` bytes (and
/// before reading anything when `Content-Length` already says so).
///
/// # Errors
/// [`BodyError::TooLarge`] past `max`, [`BodyError::Unreadable`] when the
/// body stream fails.
pub async fn read<B>(body: B, max: usize, headers: &HeaderMap) -> Result<Bytes, BodyError>
where
    B: Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    if declares_over(headers, max) {
        return Err(BodyError::TooLarge { max });
    }
    // By hand rather than `Limited` and `collect`: a body of one frame
    // (the usual request) is handed back as it came, with no list of
    // frames allocated for it.
    let mut body = std::pin::pin!(body);
    let mut first = Bytes::new();
    let mut joined: Option<BytesMut> = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BodyError::Unreadable(e.to_string()))?;
        // Trailers are not part of the body.
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let len = joined.as_ref().map_or(first.len(), BytesMut::len);
        if data.len() > max - len {
            return Err(BodyError::TooLarge { max });
        }
        match joined.as_mut() {
            Some(all) => all.extend_from_slice(&data),
            None if first.is_empty() => first = data,
            None => {
                let mut all = BytesMut::with_capacity(first.len() + data.len());
                all.extend_from_slice(&first);
                all.extend_from_slice(&data);
                joined = Some(all);
            }
        }
    }
    Ok(joined.map_or(first, BytesMut::freeze))
}

/// How a body is read: as JSON, maybe JSON, or bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BodyKind {
    /// The content type says JSON: canonicalise, and a body that does not
    /// parse is the client's error.
    Json,
    /// No (or a generic) content type, and it starts like a JSON object or
    /// array: canonicalise if it parses, else hash the bytes.
    MaybeJson,
    /// Anything else: hash the bytes.
    Bytes,
}

/// The media type's essence (`type/subtype`, lower case, no parameters),
/// borrowed when it already is lower case: no allocation for the usual
/// `application/json`.
fn essence(content_type: &str) -> std::borrow::Cow<'_, str> {
    let e = content_type.split(';').next().unwrap_or("").trim();
    if e.bytes().any(|b| b.is_ascii_uppercase()) {
        std::borrow::Cow::Owned(e.to_ascii_lowercase())
    } else {
        std::borrow::Cow::Borrowed(e)
    }
}

/// Whether a media type is JSON: `application/json` or any `type/x+json`
/// (RFC 6839 structured syntax suffix), parameters allowed. Not NDJSON
/// (`application/x-ndjson`), not `application/json-seq`: a stream of values
/// is not one JSON value.
#[must_use]
pub fn is_json(content_type: &str) -> bool {
    let e = essence(content_type);
    match e.split_once('/') {
        Some((ty, sub)) => {
            !ty.is_empty()
                && (e == "application/json"
                    || sub.strip_suffix("+json").is_some_and(|s| !s.is_empty()))
        }
        None => false,
    }
}

/// Sniffs how to read a body, by the rule above, without parsing it.
#[must_use]
pub fn kind(headers: &HeaderMap, body: &[u8]) -> BodyKind {
    let ct = headers.get(http::header::CONTENT_TYPE);
    // The usual spelling, without taking it apart.
    if ct.is_some_and(|v| v.as_bytes() == b"application/json") {
        return BodyKind::Json;
    }
    let ct = ct.and_then(|v| v.to_str().ok()).unwrap_or("");
    if is_json(ct) {
        return BodyKind::Json;
    }
    let e = essence(ct);
    let generic = e.is_empty() || e == "text/plain" || e == "application/x-www-form-urlencoded";
    if generic
        && matches!(
            body.iter().find(|b| !b.is_ascii_whitespace()),
            Some(b'{' | b'[')
        )
    {
        BodyKind::MaybeJson
    } else {
        BodyKind::Bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Frame;
    use http_body_util::StreamBody;

    type Part = Result<Frame<Bytes>, std::io::Error>;
    type Case = (Vec<Part>, usize, Result<&'static [u8], BodyError>);

    fn frames(
        parts: Vec<Part>,
    ) -> StreamBody<futures_util::stream::Iter<std::vec::IntoIter<Part>>> {
        StreamBody::new(futures_util::stream::iter(parts))
    }

    fn data(b: &'static [u8]) -> Part {
        Ok(Frame::data(Bytes::from_static(b)))
    }

    #[tokio::test]
    async fn bodies_are_read_whole_within_the_cap() {
        let h = HeaderMap::new();
        let mut trailers = HeaderMap::new();
        trailers.insert("x-t", http::HeaderValue::from_static("1"));
        let cases: Vec<Case> = vec![
            (vec![], 4, Ok(b"")),
            (vec![data(b"abcd")], 4, Ok(b"abcd")),
            (
                vec![data(b""), data(b"ab"), data(b""), data(b"cd")],
                4,
                Ok(b"abcd"),
            ),
            (vec![data(b"ab"), data(b"c"), data(b"d")], 4, Ok(b"abcd")),
            (
                vec![data(b"ab"), Ok(Frame::trailers(trailers)), data(b"c")],
                4,
                Ok(b"abc"),
            ),
            (vec![data(b"abcde")], 4, Err(BodyError::TooLarge { max: 4 })),
            (
                vec![data(b"ab"), data(b"c"), data(b"de")],
                4,
                Err(BodyError::TooLarge { max: 4 }),
            ),
            (
                vec![data(b"ab"), Err(std::io::Error::other("reset"))],
                4,
                Err(BodyError::Unreadable("reset".into())),
            ),
        ];
        for (i, (parts, max, want)) in cases.into_iter().enumerate() {
            let got = read(frames(parts), max, &h).await;
            assert_eq!(got.as_deref().map_err(Clone::clone), want, "case {i}");
        }
    }

    #[test]
    fn json_media_types() {
        for ct in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
            "application/problem+json",
            "application/vnd.api+json;v=2",
            " application/merge-patch+json ",
        ] {
            assert!(is_json(ct), "{ct}");
        }
        for ct in [
            "",
            "application/x-ndjson",
            "application/json-seq",
            "application/jsonl",
            "text/plain; note=json",
            "application/+json",
            "json",
            "text/json5",
            "application/jsonp",
        ] {
            assert!(!is_json(ct), "{ct}");
        }
    }

    #[test]
    fn ndjson_is_bytes() {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/x-ndjson"),
        );
        assert_eq!(kind(&h, b"{\"a\":1}\n{\"a\":2}\n"), BodyKind::Bytes);
        h.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json; charset=utf-8"),
        );
        assert_eq!(kind(&h, b"{}"), BodyKind::Json);
    }
}
