//! `reconcile.lookup`: the backend asked what became of an unknown
//! outcome, as the library's [`Reconcile`] hook. A `GET` of the route's
//! lookup path (the client's key in it, percent-encoded) on the route's
//! upstream, with the repeat's own headers (its caller's identity, the
//! forwarding headers the gateway writes) and no body: 200 is the effect
//! and its answer, 404 its absence, anything else (or nothing within the
//! route's `timeout`) leaves it unknown.

use crate::config::Lookup;
use crate::serve::upstream::pool::{Pool, Secure};
use crate::serve::upstream::{Failure, forward};
use axum::body::Body;
use axum::extract::ConnectInfo;
use http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use norepeat::idempotency::{Reconcile, ReconcileFuture, Reconciled};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// One idempotency route's lookup.
#[derive(Clone)]
pub(crate) struct Lookups {
    pub(crate) client: Pool,
    pub(crate) lookup: Lookup,
    pub(crate) timeout: Duration,
    /// The largest answer kept (the route's `max_stored_response`); a
    /// larger one is kept without its body, as the library keeps any.
    pub(crate) max_body: usize,
    /// The route's label, for `norepeat_gateway_reconcile_total`.
    pub(crate) route: Arc<str>,
}

impl Reconcile for Lookups {
    fn reconcile(&self, req: &http::request::Parts, key: &str) -> ReconcileFuture {
        let this = self.clone();
        let lookup = request(&self.lookup, req, key);
        Box::pin(async move {
            let found = match lookup {
                Some(lookup) => this.ask(lookup).await,
                None => Reconciled::Unknown,
            };
            let result = match &found {
                Reconciled::Done(_) => "done",
                Reconciled::Absent => "absent",
                _ => "unknown",
            };
            metrics::counter!("norepeat_gateway_reconcile_total", "route" => this.route.to_string(), "result" => result)
                .increment(1);
            tracing::info!(route = %this.route, result, "reconciled an unknown outcome");
            found
        })
    }
}

impl Lookups {
    async fn ask(&self, req: Request<Body>) -> Reconciled {
        let answer = forward(self.client.get(), self.timeout, Some(self.timeout), req).await;
        let res = match answer {
            Ok(res) => res,
            Err(
                Failure::Unavailable | Failure::Timeout | Failure::ClientBody | Failure::Switched,
            ) => {
                return Reconciled::Unknown;
            }
        };
        match res.status() {
            StatusCode::OK => {}
            StatusCode::NOT_FOUND => return Reconciled::Absent,
            _ => return Reconciled::Unknown,
        }
        let (head, body) = res.into_parts();
        // The whole answer within the route's timeout, or still unknown:
        // half an answer is not the account of an effect.
        let read = http_body_util::Limited::new(body, self.max_body.saturating_add(1)).collect();
        let body = match tokio::time::timeout(self.timeout, read).await {
            Ok(Ok(collected)) => collected.to_bytes(),
            _ => return Reconciled::Unknown,
        };
        Reconciled::Done(http::Response::from_parts(head, body))
    }
}

/// The lookup of `key` for the repeat `req`: its headers but those that
/// describe a body, its peer and scheme for the forwarding headers.
fn request(lookup: &Lookup, req: &http::request::Parts, key: &str) -> Option<Request<Body>> {
    let path = lookup.path.replace("{key}", &percent_encoded(key));
    let mut out = Request::builder()
        .method(Method::GET)
        .uri(path)
        .body(Body::empty())
        .ok()?;
    let headers = out.headers_mut();
    for (name, value) in &req.headers {
        let body_header = [
            header::CONTENT_LENGTH,
            header::CONTENT_TYPE,
            header::CONTENT_ENCODING,
            header::TRANSFER_ENCODING,
            header::EXPECT,
        ]
        .contains(name);
        if !body_header {
            headers.append(name, value.clone());
        }
    }
    let ext = out.extensions_mut();
    if let Some(peer) = req.extensions.get::<ConnectInfo<SocketAddr>>() {
        ext.insert(*peer);
    }
    if req.extensions.get::<Secure>().is_some() {
        ext.insert(Secure);
    }
    Some(out)
}

/// `key` with every byte but the URI's unreserved ones percent-encoded
/// (RFC 3986 §2.3). Written here: one path segment of visible ASCII (the
/// library refuses any other key) needs no crate.
fn percent_encoded(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::percent_encoded;

    #[test]
    fn a_key_is_one_path_segment() {
        assert_eq!(percent_encoded("pay-1.a_b~"), "pay-1.a_b~");
        assert_eq!(percent_encoded("a/b?c#d e%"), "a%2Fb%3Fc%23d%20e%25");
    }
}
