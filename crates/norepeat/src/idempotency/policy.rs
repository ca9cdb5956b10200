//! Which responses an [`IdempotencyLayer`](super::IdempotencyLayer) stores
//! ([`StorePolicy`]) and which of their headers it replays.

use http::{HeaderName, StatusCode, header};

/// Which finished responses are stored and replayed. A response that is
/// not stored releases the key, so a retry runs the handler again. A
/// stored response whose body cannot be kept (over the cap, an event
/// stream, trailers, a body that breaks) is stored without it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StorePolicy {
    /// 2xx, and the 4xx that describe the request itself (400, 422, 410,
    /// ...). Not 401, 403, 404, 408, 409, 413 or 429: nothing happened, and
    /// the answer describes the caller or a moment (a login, a missing
    /// resource, a lock, a size limit, a rate), not an effect; it may well
    /// change on retry, and a client sending fresh keys must not pile up a
    /// day's record for each (a 404 per unknown id at 5k requests/s is
    /// gigabytes an hour). No 1xx, 3xx or 5xx.
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
        for s in [200, 201, 204, 400, 410, 422] {
            assert!(p.stores(StatusCode::from_u16(s).unwrap()), "{s}");
        }
        for s in [101, 302, 401, 403, 404, 408, 409, 413, 429, 500, 502, 503] {
            assert!(!p.stores(StatusCode::from_u16(s).unwrap()), "{s}");
        }
        assert!(StorePolicy::All.stores(StatusCode::INTERNAL_SERVER_ERROR));
        assert!(!StorePolicy::SuccessOnly.stores(StatusCode::BAD_REQUEST));
    }
}
