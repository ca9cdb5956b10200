//! Who the caller is (`identity`): its sources read and hashed
//! ([`caller`]), the backend asked before the layers read it
//! ([`introspect`]), and whose keys (the caller on its site, [`scope`]).

pub(crate) mod caller;
mod hash;
pub(crate) mod introspect;
pub(crate) mod scope;

use axum::body::Body;
use caller::Asks;
use http::{Request, Response};
use introspect::Introspected;

/// The identify phase: on a route whose caller the backend names, asks
/// it (`introspect`) and puts the answer in `req`'s extensions for the
/// layers; the client's answer instead when there is no caller to be had
/// (401, 503), but on a `shadow` route, whose layers count a request
/// without a caller and let it through. Any other identity is read by the
/// layers themselves; a route that does not read the caller never asks.
///
/// # Errors
/// The client's answer: 401 `unauthenticated` when the backend refuses
/// the credential, 503 `guard_unavailable` when it gives no usable answer.
pub(crate) async fn identify(
    caller: &caller::Caller,
    req: Request<Body>,
) -> Result<Request<Body>, Response<Body>> {
    if caller.asks() == Asks::Never {
        return Ok(req);
    }
    let (mut parts, body) = req.into_parts();
    if let Some(introspector) = caller.to_ask(&parts) {
        let trusted = caller.peer_is_trusted(&parts.extensions);
        match introspector.ask(&parts, trusted).await {
            Ok(id) => {
                parts.extensions.insert(Introspected(id));
            }
            // Nothing put in the extensions: a credential without a
            // name, no caller, which a shadow route's layers count.
            Err(_) if caller.asks() == Asks::Observing => {}
            Err(answer) => return Err(answer),
        }
    }
    Ok(Request::from_parts(parts, body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{StatusCode, header};
    use norepeat::problem::Problem;

    /// `any_of`: the backend is asked only when no source before it is
    /// present; a request without a credential is not asked about (no
    /// caller: the address, or 401 when required); a backend that cannot
    /// be reached is 503 `guard_unavailable`.
    #[tokio::test]
    async fn an_earlier_source_present_is_never_asked_about() {
        use norepeat::identity::Identify;
        // Nothing listens on port 9.
        let config = crate::config::Config::parse(
            "g.yaml",
            b"upstream: http://127.0.0.1:9\nidentity:\n  any_of: [{ header: X-User-Id }, { introspect: { path: /who, user: { json: /id } } }]\n",
        )
        .unwrap();
        let caller = caller::Caller::asking(&config.identity, &config.upstream);
        let req = |pairs: &[(&str, &str)]| {
            let mut r = Request::post("/payments");
            for (k, v) in pairs {
                r = r.header(*k, *v);
            }
            r.body(Body::empty()).unwrap()
        };
        let header = req(&[("x-user-id", "7"), ("cookie", "s=1")]);
        assert!(caller.to_ask(&header.into_parts().0).is_none());
        let cookie = req(&[("cookie", "s=1")]);
        assert!(caller.to_ask(&cookie.into_parts().0).is_some());
        let bare = identify(&caller, req(&[])).await.unwrap();
        let (parts, _) = bare.into_parts();
        assert!(matches!(
            parts.extensions.get::<Introspected>(),
            Some(Introspected(None))
        ));
        assert_eq!(caller.identify(&parts), None, "no peer, not required");
        let refused = identify(&caller, req(&[("cookie", "s=1")]))
            .await
            .unwrap_err();
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(refused.headers().contains_key(header::RETRY_AFTER));
        assert_eq!(
            refused
                .extensions()
                .get::<Problem>()
                .map(|p| p.code.as_str()),
            Some("guard_unavailable")
        );
        // A header, no asking: read by the layers as before.
        let header = identify(&caller, req(&[("x-user-id", "7")])).await.unwrap();
        assert!(
            caller
                .identify(&header.into_parts().0)
                .is_some_and(|id| id.starts_with("h:"))
        );
    }
}
