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

/// The media type's essence (`type/subtype`, lower case, no parameters).
fn essence(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// Whether a media type is JSON: `application/json` or any `type/x+json`
/// (RFC 6839 structured syntax suffix), parameters allowed. Not NDJSON
/// (`application/x-ndjson`), not `application/json-seq`: a stream of values
/// is not one JSON value.
pub(crate) fn is_json(content_type: &str) -> bool {
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

/// Sniffs how to fingerprint a body, without parsing it (the fingerprint
/// parses it once).
pub(crate) fn kind(headers: &HeaderMap, body: &[u8]) -> BodyKind {
    let ct = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
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
