//! Reading and validating JSON bodies.

use crate::error::ApiError;
use axum::body::{Body, Bytes};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use norepeat::problem::{Code, Problem};
use serde_json::{Map, Value};

/// Largest body the shop reads.
pub(crate) const MAX_BODY: usize = 64 * 1024;

/// Reads a body up to [`MAX_BODY`] (413 past it).
pub(crate) async fn read(body: Body) -> Result<Bytes, ApiError> {
    match Limited::new(body, MAX_BODY).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(ApiError::Problem(
            Problem::new(Code::PayloadTooLarge).detail("The request body is larger than 64 KiB."),
        )),
        Err(e) => Err(ApiError::Invalid(format!(
            "The body could not be read: {e}"
        ))),
    }
}

/// Parses a JSON object.
pub(crate) fn object(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
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

/// A required integer field within `range`.
pub(crate) fn integer(
    m: &Map<String, Value>,
    field: &str,
    range: std::ops::RangeInclusive<i64>,
) -> Result<i64, ApiError> {
    let v = m
        .get(field)
        .ok_or_else(|| ApiError::Invalid(format!("`{field}` is required.")))?;
    let n = v
        .as_i64()
        .ok_or_else(|| ApiError::Invalid(format!("`{field}` must be an integer.")))?;
    if range.contains(&n) {
        Ok(n)
    } else {
        Err(ApiError::Invalid(format!(
            "`{field}` must be between {} and {}.",
            range.start(),
            range.end()
        )))
    }
}
