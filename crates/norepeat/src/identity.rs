//! Who is calling: the [`Identify`] extractor and [`UserHeader`], its
//! header-based default.
//!
//! Guards scope their keys by the caller. [`Identify`] turns a request's
//! head into a caller id (tenant and user, as your application sees it), or
//! `None`, which a guard answers with 401 `unauthenticated` and the
//! extractor's own [`missing`](Identify::missing) text. Any
//! `Fn(&http::request::Parts) -> Option<String>` is an extractor.
//!
//! ```
//! use norepeat::identity::{Identify, UserHeader};
//! let req = http::Request::builder().header("x-user-id", "u1").body(()).unwrap();
//! let (parts, _) = req.into_parts();
//! assert_eq!(UserHeader::default().identify(&parts).as_deref(), Some("u1"));
//! // A closure works too: here, tenant and user from two headers.
//! let by_tenant = |p: &http::request::Parts| {
//!     Some(format!("{}/{}", p.headers.get("x-tenant")?.to_str().ok()?,
//!                           p.headers.get("x-user-id")?.to_str().ok()?))
//! };
//! assert_eq!(by_tenant.identify(&parts), None);
//! ```

use http::HeaderName;
use http::request::Parts;
use std::borrow::Cow;

/// Extracts the caller's id from a request's head.
pub trait Identify: Send + Sync + 'static {
    /// The caller's id, or `None` when the request carries no valid one.
    fn identify(&self, parts: &Parts) -> Option<String>;

    /// What a request without a valid caller lacks: the `detail` of the 401
    /// `unauthenticated` answer. Say what the caller must send.
    fn missing(&self) -> Cow<'static, str> {
        Cow::Borrowed("This request carries no valid caller identity.")
    }
}

impl<F> Identify for F
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    fn identify(&self, parts: &Parts) -> Option<String> {
        self(parts)
    }
}

/// Takes the caller from a header holding 1 to 64 visible ASCII characters
/// (default `X-User-Id`). Anything else (missing, empty, longer, not
/// ASCII, not UTF-8) is no identity, and so is the header sent twice: a
/// proxy that appends its header rather than replacing the client's must
/// not let the client choose which one counts.
///
/// ```
/// use norepeat::identity::{Identify, UserHeader};
/// let req = http::Request::builder()
///     .header("x-user-id", "mallory")
///     .header("x-user-id", "u1")
///     .body(())
///     .unwrap();
/// assert_eq!(UserHeader::default().identify(&req.into_parts().0), None);
/// ```
///
/// This trusts the header: put it behind an authentication layer that sets
/// it, never straight on the internet.
#[derive(Debug, Clone)]
pub struct UserHeader {
    name: HeaderName,
}

impl Default for UserHeader {
    fn default() -> Self {
        Self::new(HeaderName::from_static("x-user-id"))
    }
}

impl UserHeader {
    /// Reads the caller from header `name`.
    #[must_use]
    pub fn new(name: HeaderName) -> Self {
        Self { name }
    }
}

/// Whether `s` is 1 to `max` visible ASCII characters (`!` to `~`).
#[must_use]
pub fn is_visible_ascii(s: &[u8], max: usize) -> bool {
    !s.is_empty() && s.len() <= max && s.iter().all(|b| (0x21..=0x7e).contains(b))
}

impl UserHeader {
    /// The caller named in `headers`, if the header is there once and
    /// valid.
    #[must_use]
    pub fn user_in(&self, headers: &http::HeaderMap) -> Option<String> {
        let mut values = headers.get_all(&self.name).iter();
        let v = values.next()?.as_bytes();
        // Two values are two claims; which one is true is a guess.
        if values.next().is_some() || !is_visible_ascii(v, 64) {
            return None;
        }
        // Visible ASCII is valid UTF-8.
        std::str::from_utf8(v).ok().map(str::to_owned)
    }
}

impl Identify for UserHeader {
    fn identify(&self, parts: &Parts) -> Option<String> {
        self.user_in(&parts.headers)
    }

    /// "Exactly one valid X-User-Id header (1 to 64 visible ASCII
    /// characters) is required.", naming this extractor's header.
    fn missing(&self) -> Cow<'static, str> {
        Cow::Owned(format!(
            "Exactly one valid {} header (1 to 64 visible ASCII characters) is required.",
            title_case(self.name.as_str())
        ))
    }
}

/// `x-tenant-user` as `X-Tenant-User` (header names are stored in lower
/// case).
pub(crate) fn title_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut up = true;
    for c in name.chars() {
        out.push(if up { c.to_ascii_uppercase() } else { c });
        up = c == '-';
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(v: &[u8]) -> Parts {
        let mut req = http::Request::new(());
        req.headers_mut()
            .insert("x-user-id", http::HeaderValue::from_bytes(v).unwrap());
        req.into_parts().0
    }

    #[test]
    fn rejects_what_is_not_an_id() {
        let id = UserHeader::default();
        assert_eq!(id.identify(&parts(b"u1")).as_deref(), Some("u1"));
        assert_eq!(id.identify(&parts(&[b'a'; 64])).map(|s| s.len()), Some(64));
        assert_eq!(id.identify(&parts(&[b'a'; 65])), None);
        assert_eq!(id.identify(&parts(b"a b")), None);
        assert_eq!(id.identify(&parts(b"\xff\xfe")), None);
        assert_eq!(id.identify(&http::Request::new(()).into_parts().0), None);
    }

    #[test]
    fn the_header_twice_is_no_identity() {
        let id = UserHeader::default();
        for (a, b) in [("mallory", "u1"), ("u1", "u1")] {
            let req = http::Request::builder()
                .header("x-user-id", a)
                .header("x-user-id", b)
                .body(())
                .unwrap();
            assert_eq!(id.identify(&req.into_parts().0), None, "{a}, {b}");
        }
    }

    #[test]
    fn missing_names_the_header() {
        assert_eq!(
            UserHeader::default().missing(),
            "Exactly one valid X-User-Id header (1 to 64 visible ASCII characters) is required."
        );
        assert_eq!(
            UserHeader::new(HeaderName::from_static("x-tenant-user")).missing(),
            "Exactly one valid X-Tenant-User header (1 to 64 visible ASCII characters) is required."
        );
        let closure = |_: &Parts| None;
        assert_eq!(
            closure.missing(),
            "This request carries no valid caller identity."
        );
    }
}
