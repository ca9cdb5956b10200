//! Which responses an [`IdempotencyLayer`](super::IdempotencyLayer) stores
//! ([`StorePolicy`]) and which of their headers it replays
//! ([`StoredHeaders`]).

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use std::sync::Arc;

/// Which finished responses are stored and replayed. A response that is
/// not stored releases the key, so a retry runs the handler again. A
/// stored response whose body cannot be kept (over the cap, an event
/// stream, trailers, a body that breaks) is stored without it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StorePolicy {
    /// 2xx, 3xx (a form's `303 See Other` to the order it made: the
    /// request was handled), and the 4xx that describe the request itself
    /// (400, 422, 410, ...). Not 401, 403, 404, 408, 409, 413 or 429: nothing happened, and
    /// the answer describes the caller or a moment (a login, a missing
    /// resource, a lock, a size limit, a rate), not an effect; it may well
    /// change on retry, and a client sending fresh keys must not pile up a
    /// day's record for each (a 404 per unknown id at 5k requests/s is
    /// gigabytes an hour). No 1xx or 5xx.
    #[default]
    Default,
    /// Every response once the handler has started, 5xx included: Stripe's
    /// behaviour. Only a handler *error* (no response at all) releases.
    All,
    /// 2xx only.
    SuccessOnly,
}

impl StorePolicy {
    /// Whether a response with `status` is stored.
    #[must_use]
    pub fn stores(self, status: StatusCode) -> bool {
        match self {
            StorePolicy::All => true,
            StorePolicy::SuccessOnly => status.is_success(),
            StorePolicy::Default => {
                status.is_success()
                    || status.is_redirection()
                    || (status.is_client_error()
                        && !matches!(status.as_u16(), 401 | 403 | 404 | 408 | 409 | 413 | 429))
            }
        }
    }
}

/// The response headers replayed by default (besides the status and body).
pub const DEFAULT_REPLAYED_HEADERS: [HeaderName; 8] = [
    header::CONTENT_TYPE,
    header::CONTENT_ENCODING,
    header::CONTENT_LANGUAGE,
    header::CONTENT_LOCATION,
    header::LOCATION,
    header::ETAG,
    header::LAST_MODIFIED,
    header::LINK,
];

/// Which response headers a record keeps and a replay sends (besides the
/// status and the body). Whichever is chosen, a few are never stored:
/// `Set-Cookie` (a replay must not hand out a session), the hop-by-hop
/// headers of RFC 9110 §7.6.1 (`Connection`, every header it names,
/// `Keep-Alive`, `Proxy-Connection`, `TE`, `Trailer`, `Transfer-Encoding`,
/// `Upgrade`; and `Proxy-Authenticate`), `Content-Length` (the replayed
/// body is framed anew) and the replay's own markers.
///
/// ```
/// use http::{HeaderMap, HeaderName};
/// use norepeat::idempotency::StoredHeaders;
///
/// let mut h = HeaderMap::new();
/// h.insert("content-type", "application/json".parse().unwrap());
/// h.insert("x-order", "7".parse().unwrap());
/// h.insert("set-cookie", "session=s3cret".parse().unwrap());
/// h.insert("connection", "x-hop".parse().unwrap());
/// h.insert("x-hop", "1".parse().unwrap());
/// let kept = |s: &StoredHeaders| -> Vec<String> {
///     s.select(&h).map(|(n, _)| n.to_string()).collect()
/// };
/// // The default: a short allow-list.
/// assert_eq!(kept(&StoredHeaders::default()), ["content-type"]);
/// // What a reverse proxy replays: everything the backend sent but the above.
/// assert_eq!(kept(&StoredHeaders::AllButHopByHop), ["content-type", "x-order"]);
/// let listed = StoredHeaders::only([HeaderName::from_static("x-order")]);
/// assert_eq!(kept(&listed), ["x-order"]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoredHeaders {
    /// Only these (the default: [`DEFAULT_REPLAYED_HEADERS`]). Build it
    /// with [`only`](Self::only), which drops the never-stored names.
    Only(Arc<[HeaderName]>),
    /// Every header of the response but the never-stored ones: the first
    /// answer's headers as they were, which is what a reverse proxy in front
    /// of a backend it does not know must replay (its `X-Order`, `Date`,
    /// `Cache-Control`, ...).
    AllButHopByHop,
}

impl Default for StoredHeaders {
    fn default() -> Self {
        Self::Only(Arc::from(DEFAULT_REPLAYED_HEADERS))
    }
}

impl StoredHeaders {
    /// Only the headers `names`, less those never stored.
    #[must_use]
    pub fn only<I: IntoIterator<Item = HeaderName>>(names: I) -> Self {
        Self::Only(names.into_iter().filter(|n| !never_stored(n)).collect())
    }

    /// The headers of `headers` that are stored, in their order.
    pub fn select<'a>(
        &'a self,
        headers: &'a HeaderMap,
    ) -> impl Iterator<Item = (&'a HeaderName, &'a HeaderValue)> + 'a {
        // The names a `Connection` header lists are hop-by-hop too; none
        // is looked for when there is no `Connection` (the common case).
        let named = headers.get(header::CONNECTION).is_some().then(|| {
            headers
                .get_all(header::CONNECTION)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|s| s.split(','))
                .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
                .collect::<Vec<_>>()
        });
        headers.iter().filter(move |(n, _)| {
            let kept = match self {
                Self::Only(list) => list.contains(n),
                Self::AllButHopByHop => true,
            };
            kept && !never_stored(n) && !named.as_ref().is_some_and(|l| l.contains(n))
        })
    }
}

/// Headers never stored, whatever the allow-list says: cookies (a replay
/// must not hand out a session) and hop-by-hop or framing headers (they
/// describe one connection, and the replayed body is framed anew).
pub(crate) fn never_stored(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "set-cookie"
            | "set-cookie2"
            | "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "content-length"
            | "idempotent-replayed"
            | "idempotent-body"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_policy_stores_what_describes_the_request() {
        let p = StorePolicy::Default;
        for s in [200, 201, 204, 302, 303, 400, 410, 422] {
            assert!(p.stores(StatusCode::from_u16(s).unwrap()), "{s}");
        }
        for s in [101, 401, 403, 404, 408, 409, 413, 429, 500, 502, 503] {
            assert!(!p.stores(StatusCode::from_u16(s).unwrap()), "{s}");
        }
        assert!(StorePolicy::All.stores(StatusCode::INTERNAL_SERVER_ERROR));
        assert!(!StorePolicy::SuccessOnly.stores(StatusCode::BAD_REQUEST));
    }

    fn names(s: &StoredHeaders, h: &HeaderMap) -> Vec<String> {
        s.select(h).map(|(n, _)| n.to_string()).collect()
    }

    #[test]
    fn all_but_hop_by_hop_keeps_every_end_to_end_header() {
        let mut h = HeaderMap::new();
        for (n, v) in [
            ("content-type", "application/json"),
            ("x-order", "7"),
            ("date", "Tue, 01 Dec 2026 22:00:00 GMT"),
            ("set-cookie", "a=1"),
            ("set-cookie", "b=2"),
            ("connection", "close, x-hop"),
            ("x-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("te", "trailers"),
            ("trailer", "x-sum"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "h2c"),
            ("content-length", "12"),
            ("idempotent-replayed", "true"),
            ("link", "</a>; rel=next"),
            ("link", "</b>; rel=prev"),
        ] {
            h.append(HeaderName::from_static(n), HeaderValue::from_static(v));
        }
        assert_eq!(
            names(&StoredHeaders::AllButHopByHop, &h),
            ["content-type", "x-order", "date", "link", "link"]
        );
        assert_eq!(
            names(&StoredHeaders::default(), &h),
            ["content-type", "link", "link"],
            "the default is unchanged"
        );
        // A listed hop-by-hop or cookie header is still never stored.
        let forced = StoredHeaders::Only(Arc::from([
            header::SET_COOKIE,
            HeaderName::from_static("x-hop"),
        ]));
        assert!(names(&forced, &h).is_empty());
    }
}
