//! The tower service of [`IdempotencyLayer`](super::IdempotencyLayer): claim, run, complete or release, replay.

use super::body::{Collected, Passthrough, collect_capped};
use super::claim::{Claimed, claim};
use super::layer::Config;
use super::record::{self, Completed, Digest, Owner};
use super::tx::IdempotentTx;
use crate::body as request_body;
use crate::fingerprint::InvalidJson;
use crate::identity::is_visible_ascii;
use crate::keys::Mode;
use crate::lease::{self, Claim, Completion, Renewal};
use crate::problem::{Code, Problem};
use crate::store::KeyValueStore;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use http_body::Body;
use http_body_util::{Either, Full};
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::Service;

/// The response body of an idempotent service: the handler's body passed
/// on (possibly after part of it was read), or a stored, replayed or
/// rejection body.
pub type ResponseBody<B> = Either<Passthrough<B>, Full<Bytes>>;

/// The request header that carries the client's key.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The response header that marks a replay.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// A service made idempotent by an [`IdempotencyLayer`](super::IdempotencyLayer).
pub struct Idempotency<S, G> {
    inner: S,
    cfg: Arc<Config<G>>,
}

impl<S: Clone, G> Clone for Idempotency<S, G> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            cfg: Arc::clone(&self.cfg),
        }
    }
}

impl<S, G> std::fmt::Debug for Idempotency<S, G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency").finish_non_exhaustive()
    }
}

impl<S, G> Idempotency<S, G> {
    pub(crate) fn new(inner: S, cfg: Arc<Config<G>>) -> Self {
        Self { inner, cfg }
    }
}

fn reject<B: Body>(p: &Problem) -> Response<ResponseBody<B>> {
    p.to_response().map(Either::Right)
}

fn pass<B: Body>(res: Response<B>) -> Response<ResponseBody<B>> {
    res.map(|b| Either::Left(Passthrough::new(b)))
}

impl<S, G, ReqBody, ResBody> Service<Request<ReqBody>> for Idempotency<S, G>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    G: KeyValueStore + Clone,
    ReqBody: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqBody::Error: std::error::Error + Send + Sync + 'static,
    ResBody: Body + Send + 'static,
    ResBody::Error: Send + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The clone that was polled ready handles this request.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let cfg = Arc::clone(&self.cfg);
        Box::pin(handle(cfg, inner, req))
    }
}

/// The client's key: `Ok(None)` when absent. The draft sends it as a
/// structured-field string (`"abc"`); the quotes are dropped, so `"abc"` and
/// `abc` are the same key.
fn client_key(headers: &HeaderMap) -> Result<Option<&str>, Problem> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(v) = values.next() else {
        return Ok(None);
    };
    let invalid = || {
        Problem::new(Code::InvalidIdempotencyKey)
            .detail("Idempotency-Key must be one value of 1 to 255 visible ASCII characters.")
    };
    if values.next().is_some() {
        return Err(invalid());
    }
    let mut b = v.as_bytes();
    if b.len() >= 2 && b[0] == b'"' && b[b.len() - 1] == b'"' {
        b = &b[1..b.len() - 1];
    }
    if !is_visible_ascii(b, 255) {
        return Err(invalid());
    }
    // Visible ASCII is valid UTF-8.
    std::str::from_utf8(b).map(Some).map_err(|_| invalid())
}

async fn handle<S, G, ReqBody, ResBody>(
    cfg: Arc<Config<G>>,
    mut inner: S,
    req: Request<ReqBody>,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    G: KeyValueStore + Clone,
    ReqBody: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqBody::Error: std::error::Error + Send + Sync + 'static,
    ResBody: Body + Send + 'static,
    ResBody::Error: Send + 'static,
{
    let (parts, body) = req.into_parts();
    let Some(user) = cfg.identity.identify(&parts) else {
        return Ok(reject(
            &Problem::new(Code::Unauthenticated).detail(cfg.identity.missing()),
        ));
    };
    let client_key = match client_key(&parts.headers) {
        Ok(Some(k)) => k.to_owned(),
        Ok(None) if cfg.required => {
            return Ok(reject(&Problem::new(Code::MissingIdempotencyKey).detail(
                "This operation needs an Idempotency-Key header; send a new random key (a UUID) per operation, and the same one on every retry of it.",
            )));
        }
        Ok(None) => return Ok(pass(inner.call(Request::from_parts(parts, body)).await?)),
        Err(p) => return Ok(reject(&p)),
    };
    let bytes = match request_body::read(body, cfg.max_request_body, &parts.headers).await {
        Ok(b) => b,
        Err(e) => return Ok(reject(&Problem::from(e))),
    };
    // The scope and the fingerprint take the concrete path: `/orders/1/pay`
    // and `/orders/2/pay` are different resources. The template is a label.
    let path = crate::request::client_path(&parts).to_owned();
    let route = cfg.route.as_deref().unwrap_or(&path).to_owned();
    let method = parts.method.clone();
    let method = method.as_str();
    let key = cfg.keys.key(
        Mode::Idempotency,
        &[
            user.as_bytes(),
            method.as_bytes(),
            path.as_bytes(),
            client_key.as_bytes(),
        ],
    );
    // A body declared JSON that does not parse is the client's error: 400
    // before any claim, as the fingerprint guard answers (one rule for both
    // layers; the key stays free for the corrected request).
    let fingerprint = match fingerprint_of(&cfg, &user, &path, &parts, &bytes) {
        Ok(fp) => fp,
        Err(e) => return Ok(reject(&Problem::from(e))),
    };

    // The bound on detached handlers, before the claim: a request refused
    // here leaves the key free, and its retry runs normally.
    let Ok(slot) = Arc::clone(&cfg.slots).try_acquire_owned() else {
        metrics::counter!("norepeat_decisions_total", "mode" => "idempotency", "outcome" => "rejected", "reason" => "max_detached").increment(1);
        return Ok(reject(
            &Problem::new(Code::GuardUnavailable)
                .detail("Too many requests are being processed; retry shortly with the same key.")
                .retry_after_secs(1),
        ));
    };
    let (claim, owner) = match claim(&cfg, &key, &fingerprint).await {
        Claimed::Owned(c, owner) => (c, owner),
        Claimed::Replay(done) => return Ok(replay(done)),
        Claimed::Refused(e) => return Ok(reject(&Problem::from(e))),
        Claimed::Unguarded => {
            let req = Request::from_parts(parts, ReqBody::from(bytes));
            return Ok(pass(inner.call(req).await?));
        }
    };
    tracing::debug!(user, route, "idempotency key claimed");

    // From here the work is carried to its end in a task of its own: a
    // caller that gives up (a disconnected client, a timeout layer) does not
    // stop it, its result is stored, and a retry gets the replay (or 409
    // while it still runs). The claim is never freed early.
    // The task holds the slot: a handler whose client left still counts.
    let req = Request::from_parts(parts, ReqBody::from(bytes));
    let tracker = cfg.detached.tracker().clone();
    let work = run_claimed(cfg, inner, req, claim, owner, fingerprint, route);
    lease::detach_tracked(&tracker, async move {
        let out = work.await;
        drop(slot);
        out
    })
    .await
}

/// Runs the handler under a held claim, then stores its response (complete)
/// or frees the key (release).
async fn run_claimed<S, G, ReqBody, ResBody>(
    cfg: Arc<Config<G>>,
    mut inner: S,
    req: Request<ReqBody>,
    claim: Claim<G>,
    owner: Owner,
    fingerprint: Digest,
    route: String,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    G: KeyValueStore + Clone,
    ResBody: Body,
{
    let renewal = if cfg.renew {
        Renewal::thirds(cfg.lease)
    } else {
        Renewal::none()
    };
    // Transactional completion: the handler may commit the completed
    // record with its own writes (see `tx.rs`); then there is nothing left
    // to store.
    let offer = IdempotentTx::new(
        cfg.store.clone(),
        claim.key(),
        &owner,
        &fingerprint,
        cfg.retention,
        Arc::clone(&cfg.replayed_headers),
        cfg.max_body,
    );
    let mut req = req;
    req.extensions_mut().insert(offer.clone());
    let res = match claim
        .run_renewed_by(&cfg.renewer, inner.call(req), renewal)
        .await
    {
        Ok(res) => res,
        Err(e) => {
            claim.release().await;
            return Err(e);
        }
    };
    if offer.committed() {
        claim.keep();
        return Ok(pass(res));
    }
    if !cfg.policy.stores(res.status()) {
        claim.release().await;
        return Ok(pass(res));
    }
    // The outcome is stored from here on; only its body may not be.
    if !storable_shape(&res, cfg.max_body) {
        let done = record::completed_without_body(
            &owner,
            &fingerprint,
            res.status(),
            replayed(&cfg, res.headers()),
        );
        complete(&cfg, claim, done).await;
        return Ok(pass(res));
    }
    let (head, body) = res.into_parts();
    match claim
        .run_renewed_by(&cfg.renewer, collect_capped(body, cfg.max_body), renewal)
        .await
    {
        Collected::Whole(body) => {
            let headers = replayed(&cfg, &head.headers);
            let done = record::completed(&owner, &fingerprint, head.status, headers, &body);
            complete(&cfg, claim, done).await;
            Ok(Response::from_parts(head, Either::Right(Full::new(body))))
        }
        Collected::Partial(rest) => {
            // The handler answered: its effect happened, whatever the body
            // does now. The outcome is kept without the body.
            tracing::debug!(
                route,
                "response body not stored (over the cap, trailers or broken); its outcome is"
            );
            let done = record::completed_without_body(
                &owner,
                &fingerprint,
                head.status,
                replayed(&cfg, &head.headers),
            );
            complete(&cfg, claim, done).await;
            Ok(Response::from_parts(head, Either::Left(rest)))
        }
    }
}

/// The headers of a response that are stored and replayed.
fn replayed<'a, G>(
    cfg: &'a Config<G>,
    headers: &'a HeaderMap,
) -> impl Iterator<Item = (&'a HeaderName, &'a HeaderValue)> {
    headers
        .iter()
        .filter(|(n, _)| cfg.replayed_headers.contains(n))
}

/// Stores the completed record `done` in place of the claim. When the
/// store fails, the completion is tried again in a task of its own, with
/// backoff, for up to the lease (the claim's life since its last renewal),
/// while the client gets its answer: the key of a handler that answered is
/// never deleted, so a retry waits (409) and then gets the replay. If the
/// store stays away that long, the claim ends with its lease and the loss
/// is counted (`norepeat_idempotency_completion_lost_total`).
async fn complete<G: KeyValueStore + Clone>(cfg: &Arc<Config<G>>, claim: Claim<G>, done: Vec<u8>) {
    let claim = match claim.try_complete(&done, cfg.retention).await {
        Ok(outcome) => return count(outcome),
        Err(claim) => claim,
    };
    let (retention, lease) = (cfg.retention, cfg.lease);
    let retry = async move { count(claim.complete_retrying(&done, retention, lease).await) };
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => drop(cfg.detached.tracker().spawn_on(retry, &rt)),
        Err(_) => retry.await,
    }
}

fn count(outcome: Completion) {
    match outcome {
        Completion::Lost => {
            metrics::counter!("norepeat_idempotency_stale_completions_total").increment(1);
        }
        Completion::Expiring | Completion::Failed => {
            metrics::counter!("norepeat_idempotency_completion_lost_total").increment(1);
        }
        Completion::Stored => {}
    }
}

/// 128 bits of the request's fingerprint: caller, method, route, query and
/// canonical body. The fingerprint guard's rule: a body whose content type
/// says JSON must parse (else the error, answered 400); one that only looks
/// like JSON and does not parse is hashed as bytes.
fn fingerprint_of<G>(
    cfg: &Config<G>,
    user: &str,
    route: &str,
    parts: &http::request::Parts,
    body: &Bytes,
) -> Result<Digest, InvalidJson> {
    let fp = cfg
        .fingerprinter
        .fingerprint_http(user, parts, route, body)?;
    let mut out = [0; 16];
    out.copy_from_slice(&fp.0[..16]);
    Ok(out)
}

/// Whether a response may be read to be stored: not an event stream (the
/// client would wait for its end) and not announced as over the cap.
fn storable_shape<B: Body>(res: &Response<B>, cap: usize) -> bool {
    let streaming = res
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("text/event-stream"));
    !streaming && res.body().size_hint().lower() <= cap as u64
}

fn replay<B: Body>(done: Completed) -> Response<ResponseBody<B>> {
    metrics::counter!("norepeat_decisions_total", "mode" => "idempotency", "outcome" => "replayed")
        .increment(1);
    let mut res = Response::new(Either::Right(Full::new(done.body)));
    *res.status_mut() = done.status;
    let h = res.headers_mut();
    for (name, value) in done.headers {
        h.append(name, value);
    }
    h.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&[u8]]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(IDEMPOTENCY_KEY, HeaderValue::from_bytes(v).unwrap());
        }
        h
    }

    #[test]
    fn keys_are_validated() {
        assert_eq!(client_key(&headers(&[])).unwrap(), None);
        assert_eq!(client_key(&headers(&[b"abc"])).unwrap(), Some("abc"));
        assert_eq!(client_key(&headers(&[b"\"abc\""])).unwrap(), Some("abc"));
        assert!(client_key(&headers(&[&[b'k'; 255]])).unwrap().is_some());
        for bad in [&b""[..], b"\"\"", &[b'k'; 256], b"a b", b"\xc3\xa9"] {
            assert!(client_key(&headers(&[bad])).is_err(), "{bad:?}");
        }
        assert!(client_key(&headers(&[b"a", b"b"])).is_err());
    }
}
