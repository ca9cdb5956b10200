// Over 400 lines on purpose: how a request's fingerprint is computed, and the digests already stored, which must not move (their tests).
//! How a request's fingerprint is computed: [`Fingerprinter`], re-exported
//! by [`crate::fingerprint`] (whose docs describe the canonical form). It
//! sits below the capabilities that use it, the fingerprint guard and
//! idempotency, so neither imports the other.

use crate::json::InvalidJson;
use crate::keys::{Absorb, Feed, parts_into};
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
    /// The concrete request path (`/orders/7/pay`), as [`FingerprintLayer`](crate::fingerprint::FingerprintLayer)
    /// passes it: requests to two resources are two requests. A route
    /// template here (`/orders/{id}/pay`) would make a payment of order 8
    /// a repeat of order 7's.
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
pub struct Digest(pub [u8; 32]);

/// Computes fingerprints; holds the set of ignored fields and whether the
/// query string counts.
#[derive(Debug, Clone)]
pub struct Fingerprinter {
    ignored: Arc<[Box<str>]>,
    query: bool,
}

impl Default for Fingerprinter {
    /// Ignores [`DEFAULT_IGNORED_FIELDS`].
    fn default() -> Self {
        Self::ignoring(DEFAULT_IGNORED_FIELDS)
    }
}

impl Fingerprinter {
    /// A fingerprinter that drops the JSON fields named in `fields`, at any
    /// depth, in place of [`DEFAULT_IGNORED_FIELDS`].
    ///
    /// A field named here is ignored wherever it appears, whatever it
    /// means there: with the default list, a business field called `sign`
    /// or `timestamp` (a signed contract, a delivery time) does not tell two
    /// requests apart, so two submissions differing only in it are taken as
    /// one. Name only fields that really vary between sends of the same
    /// submission; pass an empty list to ignore nothing.
    ///
    /// ```
    /// use norepeat::fingerprint::{Fingerprinter, RequestParts};
    /// let req = |body: &'static [u8]| RequestParts {
    ///     user: "u1", method: "POST", route: "/contracts", query: None, json: true, body,
    /// };
    /// let a = req(br#"{"sign":"alice"}"#);
    /// let b = req(br#"{"sign":"bob"}"#);
    /// // The default list ignores `sign`: these two are one request...
    /// let default = Fingerprinter::default();
    /// assert_eq!(default.fingerprint(&a).unwrap(), default.fingerprint(&b).unwrap());
    /// // ...a list without it tells them apart.
    /// let mine = Fingerprinter::ignoring(["traceId"]);
    /// assert_ne!(mine.fingerprint(&a).unwrap(), mine.fingerprint(&b).unwrap());
    /// ```
    #[must_use]
    pub fn ignoring<I, F>(fields: I) -> Self
    where
        I: IntoIterator<Item = F>,
        F: AsRef<str>,
    {
        Self {
            ignored: fields.into_iter().map(|f| Box::from(f.as_ref())).collect(),
            query: true,
        }
    }

    /// Leaves the query string out of the fingerprint, for a route whose
    /// handler reads no query parameter: there `POST /orders?a=1` and
    /// `POST /orders?a=2` with one body are one submission, and a client
    /// (or a cache-buster) adding a parameter must not get past the guard.
    /// By default the query counts (its `&`-separated pairs in any order):
    /// on a route that reads it, two queries are two requests.
    ///
    /// ```
    /// use norepeat::fingerprint::{Fingerprinter, RequestParts};
    /// let req = |query| RequestParts {
    ///     user: "u1", method: "POST", route: "/orders", query, json: true, body: br#"{"sku":"S"}"#,
    /// };
    /// let f = Fingerprinter::default();
    /// assert_ne!(f.fingerprint(&req(None)).unwrap(), f.fingerprint(&req(Some("_=1"))).unwrap());
    /// let f = Fingerprinter::default().ignore_query();
    /// assert_eq!(f.fingerprint(&req(None)).unwrap(), f.fingerprint(&req(Some("_=1"))).unwrap());
    /// ```
    #[must_use]
    pub fn ignore_query(mut self) -> Self {
        self.query = false;
        self
    }

    /// The fingerprint of a request.
    ///
    /// # Errors
    /// [`InvalidJson`] when `parts.json` is set and the body does not parse.
    pub fn fingerprint(&self, parts: &RequestParts<'_>) -> Result<Digest, InvalidJson> {
        let mut h = Feed::new();
        parts_into(
            &mut h,
            &[
                parts.user.as_bytes(),
                parts.method.as_bytes(),
                parts.route.as_bytes(),
            ],
        );
        // Ignored, the query hashes as an empty one: the same bytes as a
        // request without a query.
        let query = if self.query { parts.query } else { None };
        hash_query(&mut h, query.unwrap_or(""));
        if parts.json {
            let canonical = self.canonicalize(parts.body)?;
            h.absorb(b"J");
            h.absorb(&canonical);
        } else {
            h.absorb(b"B");
            parts_into(&mut h, &[parts.body]);
        }
        Ok(Digest(*h.finalize().as_bytes()))
    }

    /// The fingerprint of an HTTP request, by the one JSON rule of
    /// [`crate::body`]: a body whose content type says JSON must parse (else
    /// [`InvalidJson`], which the layers answer 400); one that only looks
    /// like JSON and does not parse is hashed as bytes. `path` is the
    /// concrete request path.
    ///
    /// ```
    /// use norepeat::fingerprint::Fingerprinter;
    /// let req = http::Request::post("/orders").body(()).unwrap();
    /// let (head, ()) = req.into_parts();
    /// let f = Fingerprinter::default();
    /// let a = f.fingerprint_http("u1", &head, "/orders", br#"{"sku":"A","traceId":"1"}"#).unwrap();
    /// let b = f.fingerprint_http("u1", &head, "/orders", br#"{"traceId":"2","sku":"A"}"#).unwrap();
    /// assert_eq!(a, b);
    /// ```
    ///
    /// # Errors
    /// [`InvalidJson`]: the content type says JSON and the body does not
    /// parse.
    pub fn fingerprint_http(
        &self,
        user: &str,
        parts: &http::request::Parts,
        path: &str,
        body: &[u8],
    ) -> Result<Digest, InvalidJson> {
        use crate::body::{BodyKind, kind};
        let kind = kind(&parts.headers, body);
        let mut request = RequestParts {
            user,
            method: parts.method.as_str(),
            route: path,
            query: parts.uri.query(),
            json: kind != BodyKind::Bytes,
            body,
        };
        self.fingerprint(&request).or_else(|e| {
            if kind == BodyKind::Json {
                return Err(e);
            }
            // It only looked like JSON: its bytes are the request.
            request.json = false;
            self.fingerprint(&request)
        })
    }

    /// The canonical form of a JSON body: RFC 8785 (JCS) text of the body
    /// with the ignored fields dropped at every depth. This is what the
    /// fingerprint hashes for a JSON body.
    ///
    /// ```
    /// use norepeat::fingerprint::Fingerprinter;
    /// let fp = Fingerprinter::default();
    /// let c = fp.canonicalize(br#"{ "b": [1.0, 1e2, -0], "a": "\u00e9", "sign": "x" }"#).unwrap();
    /// assert_eq!(c, r#"{"a":"é","b":[1,100,0]}"#.as_bytes());
    /// // Duplicate keys are an error, not "the last one wins".
    /// assert!(fp.canonicalize(br#"{"a":1,"a":2}"#).is_err());
    /// ```
    ///
    /// # Errors
    /// [`InvalidJson`] when the body is not one JSON value (RFC 8259, UTF-8),
    /// holds an object with a key given twice, a lone surrogate escape, or
    /// nests deeper than 128 levels.
    pub fn canonicalize(&self, body: &[u8]) -> Result<Vec<u8>, InvalidJson> {
        crate::json::canonicalize(body, &self.ignored)
    }
}

/// Hashes the query's `&`-separated pairs in sorted order.
fn hash_query(h: &mut Feed, query: &str) {
    let mut pairs: Vec<&[u8]> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(str::as_bytes)
        .collect();
    pairs.sort_unstable();
    parts_into(h, &pairs);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp_of(body: &str) -> Digest {
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

    /// The digests of a fixed request, as every release since keys were
    /// stored computed them: a change here moves every stored record
    /// and fingerprint key, so it needs a transition (issue 37's), not an
    /// edit of this test.
    #[test]
    fn digests_are_those_already_stored() {
        let f = Fingerprinter::default();
        let json = f
            .fingerprint(&RequestParts {
                user: "u1",
                method: "POST",
                route: "/orders/7/pay",
                query: Some("b=2&a=1"),
                json: true,
                body: br#"{"sku":"S","qty":2,"sign":"x"}"#,
            })
            .unwrap();
        assert_eq!(
            hex::encode(json.0),
            "1917c3353d48d8df813155ed901c15924a33ed1b7a4e44c41517bb6e2842db90"
        );
        let bytes = f
            .fingerprint(&RequestParts {
                user: "u1",
                method: "PUT",
                route: "/files/a",
                query: None,
                json: false,
                body: &[7u8; 3000],
            })
            .unwrap();
        assert_eq!(
            hex::encode(bytes.0),
            "ef02969e818a112d75129a78484083ba2c6bd116a65f7902c1abceadba8ab25c"
        );
        let k = crate::keys::KeyBuilder::default();
        let key = k.key(
            crate::keys::Namespace::Idempotency,
            &[b"bench-user", b"POST", b"/payments", b"k-1"],
        );
        assert_eq!(key, "nr:ig76KKM0pr2V-v_aD");
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
    fn an_ignored_query_is_no_query_and_the_rest_still_counts() {
        let f = Fingerprinter::default().ignore_query();
        let base = RequestParts {
            user: "u1",
            method: "POST",
            route: "/r",
            query: None,
            json: false,
            body: b"x",
        };
        let a = f.fingerprint(&base).unwrap();
        for query in ["a=1", "a=2&b=3", "", "repeatToken=zzz"] {
            let with = RequestParts {
                query: Some(query),
                ..base
            };
            assert_eq!(a, f.fingerprint(&with).unwrap(), "{query}");
        }
        // The same as the default's fingerprint without a query.
        assert_eq!(a, Fingerprinter::default().fingerprint(&base).unwrap());
        assert_ne!(
            a,
            f.fingerprint(&RequestParts { body: b"y", ..base }).unwrap()
        );
        assert_ne!(
            a,
            f.fingerprint(&RequestParts { user: "u2", ..base }).unwrap()
        );
    }

    #[test]
    fn one_and_one_point_zero_are_one_request() {
        assert_eq!(fp_of(r#"{"q":1}"#), fp_of(r#"{"q":1.0}"#));
        assert_eq!(fp_of(r#"{"q":100}"#), fp_of(r#"{"q":1e2}"#));
        assert_eq!(fp_of(r#"{"q":0}"#), fp_of(r#"{"q":-0.0}"#));
        assert_eq!(fp_of(r#"{"q":"\u00e9"}"#), fp_of(r#"{"q":"é"}"#));
        assert_ne!(fp_of(r#"{"q":1}"#), fp_of(r#"{"q":1.5}"#));
    }

    #[test]
    fn big_integers_are_not_collapsed() {
        // Both round to the same double (2^53); they are different numbers.
        assert_ne!(
            fp_of(r#"{"q":9007199254740993}"#),
            fp_of(r#"{"q":9007199254740992}"#)
        );
        assert_ne!(
            fp_of(r#"{"q":123456789012345678901234567890}"#),
            fp_of(r#"{"q":123456789012345678901234567891}"#)
        );
        assert_eq!(
            fp_of(r#"{"q":123456789012345678901234567890}"#),
            fp_of(r#"{"q":1234567890123456789012345678.9e2}"#)
        );
        assert_ne!(fp_of(r#"{"q":1e400}"#), fp_of(r#"{"q":1e401}"#));
        // Fractions are doubles, as RFC 8785 reads them.
        assert_eq!(fp_of(r#"{"q":0.1}"#), fp_of(r#"{"q":0.10000000000000001}"#));
    }

    #[test]
    fn duplicate_keys_are_an_error_at_any_depth() {
        let f = Fingerprinter::default();
        for body in [
            r#"{"a":1,"a":1}"#,
            r#"{"a":{"b":1,"b":2}}"#,
            r#"[{"sign":1,"sign":2}]"#,
            r#"{"a":1,"\u0061":2}"#,
        ] {
            assert!(f.canonicalize(body.as_bytes()).is_err(), "{body}");
        }
        assert!(f.canonicalize(br#"{"a":{"b":1},"b":{"a":1}}"#).is_ok());
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
