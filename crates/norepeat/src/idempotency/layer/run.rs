//! The second half of an idempotent request: run the handler under the
//! held claim, then store its response (complete) or free the key
//! (release); and the replay of a stored response.

use super::{IDEMPOTENT_REPLAYED, IdempotencyLayer, OutcomeUnknown, Replayed, ResponseBody, pass};
use crate::claim::{Claim, Completion, Renewal};
use crate::idempotency::body::{Collected, collect_capped};
use crate::idempotency::record::{self, Completed, Digest, Owner};
use crate::idempotency::tx::IdempotentTx;
use crate::store::KeyValueStore;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use http_body::Body;
use http_body_util::{Either, Full};
use std::sync::Arc;
use tower::Service;

/// Runs the handler under a held claim, then stores its response (complete)
/// or frees the key (release).
pub(super) async fn run_claimed<S, G, ReqBody, ResBody>(
    cfg: Arc<IdempotencyLayer<G>>,
    mut inner: S,
    req: Request<ReqBody>,
    claim: Claim<G>,
    (owner, attempt): (Owner, u8),
    fingerprint: Digest,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    G: KeyValueStore + Clone,
    ResBody: Body,
{
    let renewal = if cfg.renew {
        Renewal::thirds(cfg.guard.lease)
    } else {
        Renewal::none()
    };
    // Transactional completion: the handler may commit the completed
    // record with its own writes (see `tx.rs`); then there is nothing left
    // to store.
    let offer = IdempotentTx::new(
        cfg.guard.store.clone(),
        claim.shared_key(),
        claim.fence(),
        &owner,
        &fingerprint,
        cfg.retention,
        cfg.replayed_headers.clone(),
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
    if res.extensions().get::<OutcomeUnknown>().is_some() {
        // Kept as the key's record, with the status the client gets, before
        // the key could be freed: every repeat is refused, none run again.
        let unknown = record::unknown(&owner, &fingerprint, attempt, res.status());
        complete(&cfg, claim, unknown).await;
        return Ok(pass(res));
    }
    if !cfg.policy.stores(res.status()) {
        // Released, its attempt number kept: the backend answered (a 5xx),
        // so the next request with the key is told it is the next attempt.
        claim.release_marked(record::released).await;
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
                route = cfg.route.as_deref(),
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
    cfg: &'a IdempotencyLayer<G>,
    headers: &'a HeaderMap,
) -> impl Iterator<Item = (&'a HeaderName, &'a HeaderValue)> {
    cfg.replayed_headers.select(headers)
}

/// Stores the completed record `done` in place of the claim. When the
/// store fails, the completion is tried again in a task of its own, with
/// backoff, for up to the lease (the claim's life since its last renewal),
/// while the client gets its answer: the key of a handler that answered is
/// never deleted, so a retry waits (409) and then gets the replay. If the
/// store stays away that long, the claim ends with its lease and the loss
/// is counted (`norepeat_idempotency_completion_lost_total`).
async fn complete<G: KeyValueStore + Clone>(
    cfg: &Arc<IdempotencyLayer<G>>,
    claim: Claim<G>,
    done: Vec<u8>,
) {
    claim
        .complete_or_keep_trying(
            done,
            cfg.retention,
            cfg.guard.lease,
            Some(cfg.detached.tracker()),
            count,
        )
        .await;
}

fn count(outcome: Completion) {
    match outcome {
        Completion::Lost => {
            metrics::counter!("norepeat_idempotency_stale_completions_total").increment(1);
        }
        Completion::Expiring => {
            metrics::counter!("norepeat_idempotency_completion_lost_total").increment(1);
        }
        Completion::Stored => {}
    }
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

pub(super) fn replay<B: Body>(done: Completed) -> Response<ResponseBody<B>> {
    let mut res = Response::new(Either::Right(Full::new(done.body)));
    *res.status_mut() = done.status;
    let h = res.headers_mut();
    for (name, value) in done.headers {
        h.append(name, value);
    }
    h.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    res.extensions_mut().insert(Replayed);
    res
}
