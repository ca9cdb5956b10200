//! Reading and validating what a request carries: JSON bodies and path
//! segments. Every string the shop stores or looks up passes through
//! [`string`] or [`Segment`], which refuse control characters (U+0000 to
//! U+001F, U+007F): PostgreSQL refuses NUL in text, and no sku, id or key
//! needs any of them.
//!
//! A body is read by the library's [`norepeat::body::read`], and is valid
//! JSON by the library's one rule ([`norepeat::json::check_json`]: RFC 8259,
//! UTF-8, no key given twice, at most 128 levels), so a body the fingerprint
//! guard refuses as malformed JSON is one every handler refuses too, with
//! the same answer.

use crate::error::ApiError;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Path};
use axum::http::HeaderMap;
use axum::http::request::Parts;
use norepeat::problem::Problem;
use serde_json::{Map, Value};

/// Largest body the shop reads.
pub(crate) const MAX_BODY: usize = 64 * 1024;

/// Reads a body up to [`MAX_BODY`] (413 past it, before reading anything
/// when `Content-Length` says so).
pub(crate) async fn read(body: Body, headers: &HeaderMap) -> Result<Bytes, ApiError> {
    norepeat::body::read(body, MAX_BODY, headers)
        .await
        .map_err(|e| ApiError::Problem(Problem::from(e)))
}

/// Parses a JSON object, strict by the library's rule: a key given twice in
/// any object of it is an error (not "the last one wins").
pub(crate) fn object(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
    norepeat::json::check_json(bytes).map_err(|e| ApiError::Problem(Problem::from(e)))?;
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::Invalid("The body must be a JSON object.".into())),
        Err(e) => Err(ApiError::Invalid(format!(
            "The body is not valid JSON: {e}"
        ))),
    }
}

/// A required string field of 1 to `max` characters.
pub(crate) fn string(m: &Map<String, Value>, field: &str, max: usize) -> Result<String, ApiError> {
    match m.get(field) {
        Some(Value::String(s)) if has_control(s) => Err(ApiError::Invalid(format!(
            "`{field}` must not contain control characters."
        ))),
        Some(Value::String(s)) if !s.is_empty() && s.chars().count() <= max => Ok(s.clone()),
        Some(Value::String(_)) => Err(ApiError::Invalid(format!(
            "`{field}` must be 1 to {max} characters."
        ))),
        Some(_) => Err(ApiError::Invalid(format!("`{field}` must be a string."))),
        None => Err(ApiError::Invalid(format!("`{field}` is required."))),
    }
}

/// An optional string field of 1 to `max` characters (null counts as absent).
pub(crate) fn opt_string(
    m: &Map<String, Value>,
    field: &str,
    max: usize,
) -> Result<Option<String>, ApiError> {
    match m.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(_) => string(m, field, max).map(Some),
    }
}

/// A required integer field within `range`. A number with a zero fraction
/// (`12.0`, `1.2e1`) is that integer: JSON Schema's `integer` (the OpenAPI
/// document's type) admits it, and the fingerprint takes `12` and `12.0`
/// for one request (RFC 8785), so the handler must not refuse one of them.
pub(crate) fn integer(
    m: &Map<String, Value>,
    field: &str,
    range: std::ops::RangeInclusive<i64>,
) -> Result<i64, ApiError> {
    let v = m
        .get(field)
        .ok_or_else(|| ApiError::Invalid(format!("`{field}` is required.")))?;
    let n = whole_number(v)
        .ok_or_else(|| ApiError::Invalid(format!("`{field}` must be an integer.")))?;
    let within = i128::from(*range.start())..=i128::from(*range.end());
    if let Some(n) = within.contains(&n).then(|| i64::try_from(n).ok()).flatten() {
        Ok(n)
    } else {
        Err(ApiError::Invalid(format!(
            "`{field}` must be between {} and {}.",
            range.start(),
            range.end()
        )))
    }
}

/// The integer a JSON number denotes, if it has no fraction: `12`, `12.0`,
/// `1.2e1`; `None` for `12.5` and for anything not a number. Past what
/// `i128` holds (`1e300`) it saturates, which is out of every range.
fn whole_number(v: &Value) -> Option<i128> {
    let n = v.as_number()?;
    if let Some(i) = n.as_i64() {
        return Some(i.into());
    }
    if let Some(u) = n.as_u64() {
        return Some(u.into());
    }
    let f = n.as_f64()?;
    // A float-to-int `as` saturates (and is exact for a whole f64 in range).
    (f.is_finite() && f.fract() == 0.0).then_some(f as i128)
}

/// Whether a string carries a control character (U+0000 to U+001F, U+007F).
pub(crate) fn has_control(s: &str) -> bool {
    s.chars().any(|c| c <= '\u{1f}' || c == '\u{7f}')
}

/// One path parameter (`/stock/{sku}`), percent-decoded, as UTF-8 without
/// control characters: 400 `invalid_request` otherwise (axum's own `Path`
/// answers plain text).
#[derive(Debug, Clone)]
pub(crate) struct Segment(pub(crate) String);

impl<S: Send + Sync> FromRequestParts<S> for Segment {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(v) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::Invalid(format!("Invalid path: {}", e.body_text())))?;
        if has_control(&v) {
            return Err(ApiError::Invalid(
                "A path segment must not contain control characters.".into(),
            ));
        }
        Ok(Segment(v))
    }
}

/// A sku is 1 to 64 characters (the contract's `invalid_request`), in a
/// path or a body alike.
pub(super) fn check_sku(sku: &str) -> Result<(), ApiError> {
    if sku.is_empty() || sku.chars().count() > 64 {
        return Err(ApiError::Invalid(
            "The sku must be 1 to 64 characters.".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        assert!(object(br#"{"a":1,"a":2}"#).is_err());
        assert!(object(br#"{"a":{"b":[{"c":1,"c":1}]}}"#).is_err());
        assert!(object(br#"{"a":1,"\u0061":2}"#).is_err());
        let m = object(br#"{"a":{"b":1},"b":[1,2.5,"x",null,true]}"#).expect("valid");
        assert_eq!(m["b"][1], 2.5);
    }

    #[test]
    fn integers_may_be_written_with_a_zero_fraction() {
        let m = object(
            br#"{"a":12,"b":12.0,"c":1.2e1,"d":12.5,"e":"12","f":-0.0,"g":1e300,"h":18446744073709551615,"i":100.0,"j":101.0}"#,
        )
        .expect("valid");
        for f in ["a", "b", "c"] {
            assert_eq!(integer(&m, f, 1..=100).expect(f), 12, "{f}");
        }
        assert_eq!(integer(&m, "f", 0..=100).expect("f"), 0);
        assert_eq!(integer(&m, "i", 1..=100).expect("i"), 100);
        let message = |f: &str| match integer(&m, f, 1..=100) {
            Err(ApiError::Invalid(s)) => s,
            other => panic!("{f}: {other:?}"),
        };
        assert_eq!(message("d"), "`d` must be an integer.");
        assert_eq!(message("e"), "`e` must be an integer.");
        for f in ["g", "h", "j"] {
            assert_eq!(message(f), format!("`{f}` must be between 1 and 100."));
        }
    }

    #[test]
    fn control_characters_are_refused() {
        let m =
            object(br#"{"a":"x\u0000","b":"y\u007f","c":"z\n","d":"ok \u00e9"}"#).expect("valid");
        for f in ["a", "b", "c"] {
            assert!(string(&m, f, 64).is_err(), "{f}");
        }
        assert_eq!(string(&m, "d", 64).expect("fine"), "ok \u{e9}");
    }
}
