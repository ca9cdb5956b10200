//! The verifier as a tower layer: [`WebhookLayer`] and the [`Webhook`]
//! service it builds, with an opt-in memory of the signatures it accepted,
//! and the answers to a refused signature.

use super::{SignatureError, WebhookVerifier, unix_now};
use crate::body;
use crate::keys::{KeyBuilder, Namespace};
use crate::middleware::{Handle, Middleware, ResponseBody, reject};
use crate::problem::{Code, Problem};
use crate::store::{KeyValueStore, KeyValueStoreExt, StoreError};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use http_body::Body;
use http_body_util::Either;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tower::Service;

/// A service behind a [`WebhookLayer`].
pub type Webhook<S> = Middleware<WebhookLayer, S>;

/// The largest body [`WebhookLayer`] reads unless told otherwise.
pub const DEFAULT_MAX_BODY: usize = 64 * 1024;

/// What [`WebhookLayer::remember_in`] does with a notice whose signature it
/// already accepted within the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnReplay {
    /// Refuse it: 409 `duplicate_submission`; the handler does not run.
    Refuse,
    /// Let it through with a [`Repeated`] extension on the request, for a
    /// handler that is idempotent and answers a repeat itself.
    PassMarked,
}

/// Put in a request's extensions by a [`WebhookLayer`] with
/// [`OnReplay::PassMarked`] when the same signed notice was accepted before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repeated;

/// Records "this signature was accepted" (`SET NX PX`); `Ok(true)` the
/// first time. The store's type is erased here so the layer stays one type.
type Remember =
    Arc<dyn Fn(String, Duration) -> BoxFuture<'static, Result<bool, StoreError>> + Send + Sync>;

#[derive(Clone)]
struct Memory {
    remember: Remember,
    keys: KeyBuilder,
    on_replay: OnReplay,
}

/// A tower layer that lets through only requests signed for a
/// [`WebhookVerifier`]. See the [module](super) docs.
#[derive(Clone)]
#[must_use]
pub struct WebhookLayer {
    verifier: WebhookVerifier,
    max_body: usize,
    memory: Option<Memory>,
}

impl fmt::Debug for WebhookLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookLayer")
            .field("verifier", &self.verifier)
            .field("max_body", &self.max_body)
            .field("on_replay", &self.memory.as_ref().map(|m| m.on_replay))
            .finish()
    }
}

impl WebhookLayer {
    /// Verifies with `verifier`, reading bodies up to [`DEFAULT_MAX_BODY`].
    /// A signed notice verifies again and again within its tolerance; see
    /// [`remember_in`](Self::remember_in) to refuse repeats.
    pub fn new(verifier: WebhookVerifier) -> Self {
        Self {
            verifier,
            max_body: DEFAULT_MAX_BODY,
            memory: None,
        }
    }

    /// The largest body read (413 `payload_too_large` past it).
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// Remembers each accepted signature in `store` (one `SET NX PX` per
    /// `t` and matching `v1`, for twice the tolerance: every moment the
    /// signature could still verify, on any clock within the tolerance), and
    /// answers a notice whose signature it already accepted as `on_replay`
    /// says. A store failure is answered 503 `guard_unavailable` (with
    /// `Retry-After`): the layer cannot tell a first delivery from a replay.
    ///
    /// ```
    /// use axum::{Router, body::Body, http::{Request, StatusCode}, routing::post};
    /// use norepeat::store::MemoryStore;
    /// use norepeat::webhook::{OnReplay, WebhookLayer, WebhookVerifier, SIGNATURE_HEADER};
    /// use tower::ServiceExt;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let verifier = WebhookVerifier::new("whsec_shared");
    /// let layer = WebhookLayer::new(verifier.clone())
    ///     .remember_in(MemoryStore::default(), OnReplay::Refuse);
    /// let app: Router = Router::new().route("/hook", post(|| async { "applied" }).layer(layer));
    /// let header = verifier.sign_now(b"{}");
    /// let notice = || Request::post("/hook").header(SIGNATURE_HEADER, &header).body(Body::from("{}")).unwrap();
    /// assert_eq!(app.clone().oneshot(notice()).await.unwrap().status(), StatusCode::OK);
    /// assert_eq!(app.oneshot(notice()).await.unwrap().status(), StatusCode::CONFLICT);
    /// # }
    /// ```
    pub fn remember_in<G: KeyValueStore + Clone>(mut self, store: G, on_replay: OnReplay) -> Self {
        let remember: Remember = Arc::new(move |key: String, ttl: Duration| {
            let store = store.clone();
            Box::pin(async move { Ok(store.put_if_absent(&key, b"1", ttl).await?.is_none()) })
        });
        self.memory = Some(Memory {
            remember,
            keys: KeyBuilder::default(),
            on_replay,
        });
        self
    }

    /// The key prefix and layout of the remembered signatures (with
    /// [`remember_in`](Self::remember_in); default [`KeyBuilder::default`]).
    pub fn keys(mut self, keys: KeyBuilder) -> Self {
        if let Some(m) = &mut self.memory {
            m.keys = keys;
        }
        self
    }
}

impl<S> tower::Layer<S> for WebhookLayer {
    type Service = Webhook<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Middleware::new(inner, self.clone())
    }
}

/// Whether a notice signed at `t` with `tag` was seen before: `Ok(false)`
/// the first time, `Ok(true)` for a repeat.
async fn seen_before(
    m: &Memory,
    tolerance: Duration,
    t: u64,
    tag: &[u8; 32],
) -> Result<bool, StoreError> {
    let key = m
        .keys
        .key(Namespace::Fingerprint, &[b"webhook", &t.to_be_bytes(), tag]);
    let ttl = tolerance
        .saturating_mul(2)
        .saturating_add(Duration::from_secs(1));
    Ok(!(m.remember)(key, ttl).await?)
}

impl<S, ReqBody, ResBody> Handle<S, ReqBody, ResBody> for WebhookLayer
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    ReqBody: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqBody::Error: std::error::Error + Send + Sync + 'static,
    ResBody: Send + 'static,
{
    type Body = ResponseBody<ResBody>;

    async fn handle(
        self: Arc<Self>,
        mut inner: S,
        req: Request<ReqBody>,
    ) -> Result<Response<Self::Body>, S::Error> {
        let refuse =
            |p: Problem| -> Result<Response<ResponseBody<ResBody>>, S::Error> { Ok(reject(&p)) };
        let cfg = &*self;
        let (mut parts, body) = req.into_parts();
        let bytes = match body::read(body, cfg.max_body, &parts.headers).await {
            Ok(b) => b,
            Err(e) => return refuse(Problem::from(e)),
        };
        let (t, tag) = match cfg
            .verifier
            .verified_tag(&parts.headers, &bytes, unix_now())
        {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(error = %e, "webhook signature refused");
                return refuse(cfg.verifier.problem(&e));
            }
        };
        if let Some(m) = &cfg.memory {
            match seen_before(m, cfg.verifier.get_tolerance(), t, &tag).await {
                Ok(false) => {}
                Ok(true) if m.on_replay == OnReplay::PassMarked => {
                    parts.extensions.insert(Repeated);
                }
                Ok(true) => {
                    tracing::debug!(t, "webhook notice replayed");
                    return refuse(Problem::new(Code::DuplicateSubmission).detail(
                        "This signed notice was already accepted; a new delivery needs a new signature.",
                    ));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "webhook signature memory unavailable");
                    return refuse(Problem::new(Code::GuardUnavailable).retry_after_secs(1));
                }
            }
        }
        let req = Request::from_parts(parts, ReqBody::from(bytes));
        Ok(inner.call(req).await?.map(Either::Left))
    }
}

impl WebhookVerifier {
    /// The 401 `invalid_signature` problem for `e`, naming the header this
    /// verifier reads when it is missing.
    ///
    /// ```
    /// use norepeat::webhook::{SignatureError, WebhookVerifier};
    /// let v = WebhookVerifier::new("s").header(http::HeaderName::from_static("x-sig"));
    /// let p = v.problem(&SignatureError::Missing);
    /// assert_eq!(p.detail, "The request carries no X-Sig header.");
    /// ```
    #[must_use]
    pub fn problem(&self, e: &SignatureError) -> Problem {
        match e {
            SignatureError::Missing => Problem::from(e.clone()).detail(format!(
                "The request carries no {} header.",
                crate::identity::title_case(self.header.as_str())
            )),
            other => Problem::from(other.clone()),
        }
    }
}

impl From<SignatureError> for Problem {
    fn from(e: SignatureError) -> Self {
        Problem::new(Code::InvalidSignature).detail(e.to_string())
    }
}
