//! Shadow mode's typed record: what a shadowed layer would have refused.
//!
//! With `.shadow(true)` the fingerprint, token, Idempotency-Key and
//! rate-limit layers take their decision, count a would-refuse in
//! `norepeat_shadow_total{guard, would}`, log it at `info`, and let the
//! request through. They also put a [`ShadowedBy`] in the extensions of the
//! response, so code outside the layer (a gateway counting by route, a
//! test) reads the decision as a value instead of a log line. A response
//! nothing would have refused has none.
//!
//! The types are plain data, free of HTTP: the layers insert them, the
//! caller reads them with `response.extensions().get::<ShadowedBy>()`.

/// One shadowed layer's decision: the guard (`fingerprint`, `token`,
/// `idempotency`, `rate_limit`) and what it would have done (the `would`
/// label of `norepeat_shadow_total`: `duplicate`, `rate_limited`,
/// `replay`, `unauthenticated`, ...).
///
/// ```
/// use norepeat::shadow::Shadowed;
/// let s = Shadowed { guard: "token", would: "duplicate" };
/// assert_eq!(s, Shadowed { guard: "token", would: "duplicate" });
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shadowed {
    /// The guard that decided, as in `norepeat_shadow_total{guard}`.
    pub guard: &'static str,
    /// What it would have done, as in `norepeat_shadow_total{would}`.
    pub would: &'static str,
}

/// Every shadowed decision on one request, in the response's extensions:
/// one [`Shadowed`] per layer that would have refused it, in the order the
/// response passed them (the innermost layer first). Two stacked layers
/// that both would refuse both appear: an outer layer adds to the list,
/// never replaces it.
///
/// ```
/// use axum::{Router, routing::post};
/// use norepeat::shadow::{Shadowed, ShadowedBy};
/// use norepeat::store::MemoryStore;
/// use norepeat::token::{TokenGuard, TokenLayer, TokenSigner};
/// use tower::ServiceExt;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let guard = TokenGuard::new(MemoryStore::default(), TokenSigner::random());
/// let app = Router::new()
///     .route("/orders", post(|| async { "ok" }))
///     .layer(TokenLayer::new(guard).shadow(true));
/// // No caller and no token: refused, were shadow mode off.
/// let req = http::Request::post("/orders").body(axum::body::Body::empty()).unwrap();
/// let res = app.oneshot(req).await.unwrap();
/// assert_eq!(res.status(), 200);
/// let by = res.extensions().get::<ShadowedBy>().unwrap();
/// assert_eq!(by.0, [Shadowed { guard: "token", would: "unauthenticated" }]);
/// # }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShadowedBy(pub Vec<Shadowed>);

impl ShadowedBy {
    /// Adds `s` to the list in `extensions`, creating it if there is none.
    pub(crate) fn add(extensions: &mut http::Extensions, s: Shadowed) {
        match extensions.get_mut::<Self>() {
            Some(by) => by.0.push(s),
            None => {
                extensions.insert(Self(vec![s]));
            }
        }
    }
}
