//! The one strict JSON reader: [`check_json`], [`InvalidJson`], and the
//! RFC 8785 (JCS) canonical form the fingerprints hash.
//!
//! A body is strict JSON when it is one JSON value (RFC 8259, UTF-8), with
//! no key given twice in any object, at most 128 levels deep. Which bodies
//! must be strict JSON is [`crate::body`]'s rule; this module is what
//! "strict" means, for the fingerprint, idempotency and an application
//! that parses JSON bodies itself. The canonical form is described in
//! [`crate::fingerprint`].
//!
//! ```
//! use norepeat::json::check_json;
//! assert!(check_json(br#"{"a":[1,2.5,"x"]}"#).is_ok());
//! assert!(check_json(br#"{"a":1,"a":2}"#).is_err());
//! ```

mod jcs;

/// The body claimed to be JSON and was not (or was ambiguous JSON: a key
/// given twice in one object).
#[derive(Debug, Clone, thiserror::Error)]
#[error("request body is not valid JSON: {0}")]
pub struct InvalidJson(pub(crate) String);

/// Whether `body` is strict JSON, by the rule of [`crate::body`]: one JSON value (RFC
/// 8259, UTF-8), no key given twice in any object, at most 128 levels deep.
/// The fingerprint canonicalises exactly the bodies this accepts.
///
/// ```
/// assert!(norepeat::json::check_json(br#"{"a":[1,2.5,"x"]}"#).is_ok());
/// assert!(norepeat::json::check_json(br#"{"a":1,"a":2}"#).is_err());
/// ```
///
/// # Errors
/// [`InvalidJson`], saying where and why.
pub fn check_json(body: &[u8]) -> Result<(), InvalidJson> {
    canonicalize(body, &[]).map(drop)
}

/// The RFC 8785 text of `body` with the fields named in `ignored` dropped
/// at every depth.
pub(crate) fn canonicalize(body: &[u8], ignored: &[Box<str>]) -> Result<Vec<u8>, InvalidJson> {
    let text = std::str::from_utf8(body).map_err(|e| InvalidJson(format!("not UTF-8: {e}")))?;
    let mut p = jcs::Parser {
        s: text.as_bytes(),
        text,
        pos: 0,
        ignored,
    };
    let value = p.document()?;
    let mut out = Vec::with_capacity(body.len());
    value.write(&mut out);
    Ok(out)
}
