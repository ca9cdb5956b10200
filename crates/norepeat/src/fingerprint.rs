//! Request fingerprints: who sent what, to which route, canonically.
//!
//! A fingerprint is BLAKE3 over, in order and length-prefixed: the user,
//! the method, the route template, the query parameters sorted, and the body.
//! A JSON body is canonicalised first: object keys sorted at every depth and
//! the ignored fields (default `traceId`, `timestamp`, `random`, `sign`)
//! dropped at every depth, so `{"b":1,"a":2}` and `{"a":2,"b":1,"traceId":"x"}`
//! are the same request. Any other body is hashed as bytes.
//!
//! ```
//! use norepeat::fingerprint::{Fingerprinter, RequestParts};
//! let fp = Fingerprinter::default();
//! let req = |body: &'static [u8]| RequestParts {
//!     user: "u1", method: "POST", route: "/orders", query: None,
//!     json: true, body,
//! };
//! let a = fp.fingerprint(&req(br#"{"sku":"SKU-1","quantity":1,"traceId":"a"}"#)).unwrap();
//! let b = fp.fingerprint(&req(br#"{"quantity":1,"traceId":"b","sku":"SKU-1"}"#)).unwrap();
//! let c = fp.fingerprint(&req(br#"{"quantity":2,"sku":"SKU-1"}"#)).unwrap();
//! assert_eq!(a, b);
//! assert_ne!(a, c);
//! ```

use crate::keys::feed_parts;
use serde_json::Value;
use std::sync::Arc;

/// The fields left out of a JSON body's fingerprint unless configured
/// otherwise: values that differ on every send of the same submission.
pub const DEFAULT_IGNORED_FIELDS: [&str; 4] = ["traceId", "timestamp", "random", "sign"];

/// What a fingerprint is computed from.
#[derive(Debug, Clone, Copy)]
pub struct RequestParts<'a> {
    /// The caller (tenant and user, as your identity extractor gives it).
    pub user: &'a str,
    /// The HTTP method (or any verb naming the operation).
    pub method: &'a str,
    /// The route template (`/orders/{id}`), not the concrete path, unless the
    /// path itself is what should tell requests apart.
    pub route: &'a str,
    /// The raw query string, if any.
    pub query: Option<&'a str>,
    /// Whether `body` is JSON and should be canonicalised.
    pub json: bool,
    /// The body.
    pub body: &'a [u8],
}

/// A 256-bit request fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

/// The body claimed to be JSON and was not.
#[derive(Debug, Clone, thiserror::Error)]
#[error("request body is not valid JSON: {0}")]
pub struct InvalidJson(String);

/// Computes fingerprints; holds the set of ignored fields.
#[derive(Debug, Clone)]
pub struct Fingerprinter {
    ignored: Arc<[Box<str>]>,
}

impl Default for Fingerprinter {
    /// Ignores [`DEFAULT_IGNORED_FIELDS`].
    fn default() -> Self {
        Self::ignoring(DEFAULT_IGNORED_FIELDS)
    }
}

impl Fingerprinter {
    /// A fingerprinter that drops the JSON fields named in `fields`, at any
    /// depth.
    #[must_use]
    pub fn ignoring<I, F>(fields: I) -> Self
    where
        I: IntoIterator<Item = F>,
        F: AsRef<str>,
    {
        Self {
            ignored: fields.into_iter().map(|f| Box::from(f.as_ref())).collect(),
        }
    }

    /// The fingerprint of a request.
    ///
    /// # Errors
    /// [`InvalidJson`] when `parts.json` is set and the body does not parse.
    pub fn fingerprint(&self, parts: &RequestParts<'_>) -> Result<Fingerprint, InvalidJson> {
        let mut h = blake3::Hasher::new();
        feed_parts(
            &mut h,
            &[
                parts.user.as_bytes(),
                parts.method.as_bytes(),
                parts.route.as_bytes(),
            ],
        );
        hash_query(&mut h, parts.query.unwrap_or(""));
        if parts.json {
            let value: Value =
                serde_json::from_slice(parts.body).map_err(|e| InvalidJson(e.to_string()))?;
            h.update(b"J");
            self.hash_value(&mut h, &value);
        } else {
            h.update(b"B");
            feed_parts(&mut h, &[parts.body]);
        }
        Ok(Fingerprint(*h.finalize().as_bytes()))
    }

    fn is_ignored(&self, field: &str) -> bool {
        self.ignored.iter().any(|f| &**f == field)
    }

    fn hash_value(&self, h: &mut blake3::Hasher, v: &Value) {
        match v {
            Value::Null => {
                h.update(b"z");
            }
            Value::Bool(b) => {
                h.update(if *b { b"t" } else { b"f" });
            }
            Value::Number(n) => {
                let s = n.to_string();
                h.update(b"n");
                h.update(&(s.len() as u64).to_le_bytes());
                h.update(s.as_bytes());
            }
            Value::String(s) => {
                h.update(b"s");
                h.update(&(s.len() as u64).to_le_bytes());
                h.update(s.as_bytes());
            }
            Value::Array(items) => {
                h.update(b"a");
                h.update(&(items.len() as u64).to_le_bytes());
                for item in items {
                    self.hash_value(h, item);
                }
            }
            Value::Object(map) => {
                // serde_json's map is sorted unless a crate in the build turns
                // on `preserve_order`; sort anyway (cheap on sorted input).
                let mut fields: Vec<(&String, &Value)> =
                    map.iter().filter(|(k, _)| !self.is_ignored(k)).collect();
                fields.sort_unstable_by(|a, b| a.0.cmp(b.0));
                h.update(b"o");
                h.update(&(fields.len() as u64).to_le_bytes());
                for (k, v) in fields {
                    h.update(&(k.len() as u64).to_le_bytes());
                    h.update(k.as_bytes());
                    self.hash_value(h, v);
                }
            }
        }
    }
}

/// Hashes the query's `&`-separated pairs in sorted order.
fn hash_query(h: &mut blake3::Hasher, query: &str) {
    let mut pairs: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
    pairs.sort_unstable();
    feed_parts(h, &pairs.iter().map(|p| p.as_bytes()).collect::<Vec<_>>());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp_of(body: &str) -> Fingerprint {
        Fingerprinter::default()
            .fingerprint(&RequestParts {
                user: "u1",
                method: "POST",
                route: "/orders/quick",
                query: None,
                json: true,
                body: body.as_bytes(),
            })
            .unwrap()
    }

    #[test]
    fn key_order_does_not_matter_at_any_depth() {
        assert_eq!(
            fp_of(r#"{"a":{"x":1,"y":[{"p":1,"q":2}]},"b":2}"#),
            fp_of(r#"{"b":2,"a":{"y":[{"q":2,"p":1}],"x":1}}"#)
        );
    }

    #[test]
    fn ignored_fields_are_dropped_at_any_depth() {
        assert_eq!(
            fp_of(r#"{"sku":"S","meta":{"traceId":"1","sign":"x","k":1},"timestamp":5}"#),
            fp_of(r#"{"sku":"S","meta":{"k":1,"random":9}}"#)
        );
    }

    #[test]
    fn values_and_shapes_matter() {
        assert_ne!(fp_of(r#"{"q":1}"#), fp_of(r#"{"q":2}"#));
        assert_ne!(fp_of(r#"{"q":"1"}"#), fp_of(r#"{"q":1}"#));
        assert_ne!(fp_of(r#"{"q":[1,2]}"#), fp_of(r#"{"q":[2,1]}"#));
        assert_ne!(fp_of(r#"{"a":"b","c":"d"}"#), fp_of(r#"{"a":"bc","":"d"}"#));
    }

    #[test]
    fn users_routes_and_query_order() {
        let f = Fingerprinter::default();
        let base = RequestParts {
            user: "u1",
            method: "POST",
            route: "/r",
            query: Some("b=2&a=1"),
            json: false,
            body: b"x",
        };
        let same = RequestParts {
            query: Some("a=1&b=2"),
            ..base
        };
        let other_user = RequestParts { user: "u2", ..base };
        let other_route = RequestParts {
            route: "/s",
            ..base
        };
        let a = f.fingerprint(&base).unwrap();
        assert_eq!(a, f.fingerprint(&same).unwrap());
        assert_ne!(a, f.fingerprint(&other_user).unwrap());
        assert_ne!(a, f.fingerprint(&other_route).unwrap());
    }

    #[test]
    fn malformed_json_is_an_error() {
        let r = Fingerprinter::default().fingerprint(&RequestParts {
            user: "u",
            method: "POST",
            route: "/",
            query: None,
            json: true,
            body: b"{\"a\":",
        });
        assert!(r.is_err());
    }
}
