//! Reading a request body once, up to a cap.

use bytes::Bytes;
use http::HeaderMap;
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};

/// Why a body could not be read.
#[derive(Debug)]
pub(crate) enum ReadError {
    TooLarge,
    Broken(String),
}

/// Reads the whole body, refusing it as soon as it passes `max` bytes (and
/// before reading anything when `Content-Length` already says so).
pub(crate) async fn read<B>(body: B, max: usize, headers: &HeaderMap) -> Result<Bytes, ReadError>
where
    B: Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(ReadError::TooLarge);
    }
    match Limited::new(body, max).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(ReadError::TooLarge),
        Err(e) => Err(ReadError::Broken(e.to_string())),
    }
}

/// How a body is fingerprinted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyKind {
    /// The content type says JSON: canonicalise, and a body that does not
    /// parse is the client's error.
    Json,
    /// No (or a generic) content type, and it starts like a JSON object or
    /// array: canonicalise if it parses, else hash the bytes.
    MaybeJson,
    /// Anything else: hash the bytes.
    Bytes,
}

/// Sniffs how to fingerprint a body, without parsing it (the fingerprint
/// parses it once).
pub(crate) fn kind(headers: &HeaderMap, body: &[u8]) -> BodyKind {
    let ct = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if ct.contains("json") {
        return BodyKind::Json;
    }
    let generic =
        ct.is_empty() || ct.starts_with("text/plain") || ct.contains("x-www-form-urlencoded");
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
