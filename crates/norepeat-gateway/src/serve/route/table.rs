//! The compiled routes: what a reload swaps whole ([`Routes`]), each
//! route's stack built once ([`Compiled`]), and the token secret their
//! token guards sign with.

use crate::config::{Config, Guard, OnStoreFailure};
use crate::serve::identify::caller::Caller;
use crate::serve::identify::scope::HostScoped;
use crate::serve::log::metrics::RouteMetrics;
use crate::serve::route::stack::{RouteService, stack};
use crate::serve::store::SharedStore;
use crate::serve::upstream::pool::{MAX_CONNECT, Pool, client};
use norepeat::idempotency::DetachedTasks;
use norepeat::store::{KeyValueStoreExt, StoreError};
use norepeat::token::{TokenGuard, TokenSigner};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Where the random token secret is kept when the file gives none.
pub(crate) const SECRET_KEY: &str = "norepeat:gateway:token-secret";

/// The part of the gateway a reload replaces.
pub(crate) struct Routes {
    pub(crate) list: Vec<Compiled>,
    /// The pass-through's upstream connections (the file's `upstream`).
    pub(crate) passthrough: Pool,
    pub(crate) caller: Caller,
    /// `cors.allow_origins`: the pages of other origins that may call the
    /// routes and ask for a token.
    pub(crate) cors: Arc<[String]>,
    /// `error_page`: the operator's page for a refusal to a browser.
    pub(crate) error_page: Option<crate::config::ErrorPage>,
    /// Issues the tokens; the guard of the fail-open token routes.
    pub(crate) tokens: Option<TokenGuard<SharedStore>>,
    /// The same signer over the store without its local memory: the guard
    /// of the fail-closed token routes.
    pub(crate) closed_tokens: Option<TokenGuard<SharedStore>>,
    /// Whether any route names a `host` (the request's site is read then).
    pub(crate) by_host: bool,
    /// Whether any route names a `content_type` (a route is then chosen
    /// with the headers: [`crate::serve::route::Choice::settled`]).
    pub(crate) by_type: bool,
    /// Token routes wait for the secret the store keeps (it was down when
    /// they were built): they follow their failure policy meanwhile.
    pub(crate) tokens_pending: bool,
    /// `hosts`: the site's names (empty: every Host is served).
    pub(crate) hosts: Arc<[String]>,
    /// `on_data_loss.hold`.
    pub(crate) data_loss_hold: std::time::Duration,
    /// `upgrades`: the `Upgrade` protocols forwarded.
    pub(crate) upgrades: Arc<[String]>,
    /// The one site keys are scoped to when `hosts` names the site's
    /// names (its first): whichever name a retry uses, its key is one.
    pub(crate) site: Option<Arc<str>>,
}

pub(crate) struct Compiled {
    pub(crate) matcher: crate::config::RouteMatch,
    /// `host`: the one site whose requests the route takes.
    pub(crate) host: Option<String>,
    /// `content_type`: the one body type the route takes.
    pub(crate) content_type: Option<crate::config::MediaType>,
    /// A guard or a rate limit: a spelling of its path that a back end
    /// would take alike must not pass it by.
    pub(crate) guarded: bool,
    /// `max_request_body`: a longer declared body is refused (413) from
    /// its head, without reading it.
    pub(crate) max_body: u64,
    /// A guarded route that refuses while the store does not answer.
    pub(crate) fails_closed: bool,
    /// An idempotency route's layer: the admin routes read and clear its
    /// records.
    pub(crate) records: Option<norepeat::idempotency::IdempotencyLayer<SharedStore>>,
    /// The route's caller (its own `identity`, else the file's).
    pub(crate) caller: Caller,
    pub(crate) metrics: Arc<RouteMetrics>,
    pub(crate) service: RouteService,
}

impl Routes {
    /// Whether a store that lost its data at `lost_at` (Unix ms) is still
    /// within `on_data_loss.hold`.
    pub(crate) fn data_loss_hold_until(&self, lost_at: u64) -> bool {
        let hold = u64::try_from(self.data_loss_hold.as_millis()).unwrap_or(u64::MAX);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        hold > 0 && now < lost_at.saturating_add(hold)
    }

    pub(crate) async fn build(
        config: &Config,
        (store, records): (&SharedStore, Option<&SharedStore>),
        (detached, stopping): (&DetachedTasks, &CancellationToken),
        tokens: Option<(TokenGuard<SharedStore>, TokenGuard<SharedStore>)>,
    ) -> Result<Self, StoreError> {
        let caller = Caller::asking(&config.identity, &config.upstream);
        let wants_tokens = config
            .routes
            .iter()
            .any(|r| matches!(r.guard, Some(Guard::Token)));
        let (tokens, closed_tokens) = match tokens {
            Some((open, closed)) if config.token_secret.is_none() => (
                Some(open.ttl(config.token_ttl)),
                Some(closed.ttl(config.token_ttl)),
            ),
            _ if wants_tokens => {
                // From the store itself, never from the local memory: an
                // instance that made up its own secret would refuse every
                // other instance's tokens.
                match token_secret(config, &store.closed()).await {
                    Ok(secret) => {
                        let signer = TokenSigner::new(secret);
                        (
                            Some(
                                TokenGuard::new(store.clone(), signer.clone())
                                    .ttl(config.token_ttl),
                            ),
                            Some(TokenGuard::new(store.closed(), signer).ttl(config.token_ttl)),
                        )
                    }
                    // The store is down (at start, or before any secret
                    // was read): the token routes follow their failure
                    // policy, and the file's watcher builds them again
                    // until the secret is read.
                    Err(e) => {
                        tracing::warn!(error = %e, "the token secret cannot be read from the store: token routes follow their on_store_failure until it can (or set token_secret)");
                        (None, None)
                    }
                }
            }
            _ => (None, None),
        };
        let tokens_pending = wants_tokens && tokens.is_none();
        let site: Option<Arc<str>> = config.hosts.first().map(|h| Arc::from(h.as_str()));
        let list = config
            .routes
            .iter()
            .map(|r| {
                let metrics = Arc::new(RouteMetrics::new(r.matcher.to_string().into()));
                // A fail-open route decides against the local memory while
                // the store is down; a fail-closed one refuses.
                let tokens = match r.on_store_failure {
                    OnStoreFailure::Open => tokens.as_ref(),
                    OnStoreFailure::Closed => closed_tokens.as_ref(),
                };
                // A route's own identity, else the file's (asking the
                // route's upstream, when the backend names the caller).
                let caller = match &r.identity {
                    Some(own) => Caller::asking(own, &r.upstream),
                    None if caller.introspects() && r.upstream != config.upstream => {
                        Caller::asking(&config.identity, &r.upstream)
                    }
                    None => caller.clone(),
                }
                .on_route(r);
                let (service, records) = stack(
                    r,
                    // A guard that keeps answers keeps them in `records`
                    // when the file has one.
                    &records
                        .filter(|_| r.guard.as_ref().is_some_and(Guard::keeps_answers))
                        .unwrap_or(store)
                        .for_route(r.on_store_failure),
                    &HostScoped::new(caller.clone()).site(site.clone()),
                    (detached, stopping),
                    tokens,
                    config.token_ttl,
                    &metrics,
                );
                Compiled {
                    matcher: r.matcher.clone(),
                    host: r.host.clone(),
                    content_type: r.content_type.clone(),
                    guarded: r.guard.is_some() || r.rate_limit.is_some(),
                    max_body: r.max_request_body,
                    fails_closed: (r.guard.is_some() || r.rate_limit.is_some())
                        && r.on_store_failure == OnStoreFailure::Closed
                        && !r.shadow,
                    service,
                    records,
                    caller,
                    metrics,
                }
            })
            .collect();
        Ok(Self {
            list,
            passthrough: client(MAX_CONNECT, &config.upstream),
            caller,
            cors: config.cors.allow_origins.clone().into(),
            error_page: config.error_page.clone(),
            tokens,
            closed_tokens,
            by_host: config.routes.iter().any(|r| r.host.is_some()),
            by_type: config.routes.iter().any(|r| r.content_type.is_some()),
            tokens_pending,
            hosts: config.hosts.clone().into(),
            upgrades: config.upgrades.clone().into(),
            data_loss_hold: config.on_data_loss_hold,
            site,
        })
    }
}

/// The token secret: the file's (or the environment's), else the one kept
/// in the store, created by the first instance with one `SET NX`.
pub(crate) async fn token_secret(
    config: &Config,
    store: &SharedStore,
) -> Result<[u8; 32], StoreError> {
    if let Some(s) = &config.token_secret {
        return Ok(blake3::derive_key(
            "norepeat-gateway token secret v1",
            s.as_bytes(),
        ));
    }
    let mut fresh = [0u8; 32];
    getrandom::fill(&mut fresh).map_err(|e| StoreError::Protocol(format!("no randomness: {e}")))?;
    let hexed = hex::encode(fresh);
    // Keys always expire; ten years is "for as long as the store lives".
    let ttl = Duration::from_secs(10 * 365 * 24 * 3600);
    match store
        .put_if_absent(SECRET_KEY, hexed.as_bytes(), ttl)
        .await?
    {
        None => Ok(fresh),
        Some(held) => hex::decode(&held)
            .ok()
            .and_then(|v| <[u8; 32]>::try_from(v).ok())
            .ok_or_else(|| {
                StoreError::Protocol(format!("{SECRET_KEY} holds no 32-byte hex secret"))
            }),
    }
}
