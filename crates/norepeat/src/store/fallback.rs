//! A primary store with a local memory store behind it.

use super::recent::{Change, Recent};
use super::{
    DecidedBy, KeyOp, KeyReply, KeyValueStore, MemoryStore, RateDecision, RateOp, RateStore,
    StoreError,
};
use bytes::Bytes;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Answers from `local` whenever `primary` fails, so one instance keeps
/// catching its own repeats (and keeps its tokens single-use) through an
/// outage. Releases, renewals and completions go to both, so a key taken
/// during the outage is released, renewed or completed where it lives.
///
/// Its own repeats include those of requests the primary admitted just
/// before it failed: a double click whose second call runs past the
/// store's budget, a token replayed once Redis went away. The keys the
/// primary took through this instance are remembered, with their values,
/// in a fixed table of 16,384 slots (1 MiB, no allocation per key), and a
/// failed call on such a key is answered from there. Owner-checked
/// releases, renewals and small replacements are applied to it; a key
/// replaced by a value over 32 bytes (a stored response) is forgotten. A
/// newer key that hashes to the same slot replaces an older one, so at
/// very high rates the table covers less time (about half a second at
/// 30,000 new keys a second): it remembers less than it was told, never
/// more. Each entry ends when the primary's copy does, at the latest.
///
/// A decision made during an outage holds on this instance for its whole
/// TTL: until the last key written locally has expired (a claim, and the
/// completion that replaced it, or a renewal that extended it), a key the
/// primary admits is checked against the local store too. A token consumed,
/// a fingerprint held or a result stored during the outage is then not
/// admitted a second time once the primary answers again, and the local
/// answer is given instead. The primary's copy of the key, just written, is
/// left alone (it expires with its TTL): it tells other instances the key
/// is taken.
///
/// Use it for fail-open routes; a fail-closed route uses the primary alone.
#[derive(Debug, Clone)]
pub struct Fallback<S> {
    primary: S,
    local: MemoryStore,
    origin: Instant,
    /// Milliseconds after `origin` until which the local store may hold a
    /// key written during an outage (0: never wrote one).
    local_until: Arc<AtomicU64>,
    /// The keys the primary took through this instance; `None` when
    /// disabled (a failed primary call is then not answered locally).
    recent: Option<Arc<Recent>>,
}

impl<S: KeyValueStore> Fallback<S> {
    /// `primary`, falling back to `local`.
    #[must_use]
    pub fn new(primary: S, local: MemoryStore) -> Self {
        Self {
            primary,
            local,
            origin: Instant::now(),
            local_until: Arc::new(AtomicU64::new(0)),
            recent: Some(Arc::new(Recent::new())),
        }
    }

    /// `primary` with the local fallback switched off: a failed call stays a
    /// failure, and the route's [`FailurePolicy`](crate::degrade::FailurePolicy)
    /// decides (fail-open then admits without any memory). Useful to compare
    /// (the shop's storm does) or to keep one store type for every route.
    #[must_use]
    pub fn disabled(primary: S) -> Self {
        Self {
            primary,
            local: MemoryStore::new(1),
            origin: Instant::now(),
            local_until: Arc::new(AtomicU64::new(0)),
            recent: None,
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether a key written locally during an outage may still be alive.
    fn may_hold_locally(&self) -> bool {
        self.now_ms() < self.local_until.load(Ordering::Relaxed)
    }

    /// Keeps the local store consulted until `ttl` from now: a key it holds
    /// from an outage lives that long.
    fn hold_locally(&self, ttl: Duration) {
        let until = after(self.now_ms(), ttl).saturating_add(1);
        self.local_until.fetch_max(until, Ordering::Relaxed);
    }

    /// The primary admitted `key`: unless the local store holds it from an
    /// outage. Then the local value is answered, as the primary would have
    /// had it seen the outage. The primary's fresh copy is left alone: it
    /// expires with its TTL, and meanwhile tells other instances the key is
    /// taken.
    fn reconcile(&self, key: &str) -> Option<Bytes> {
        if !self.may_hold_locally() {
            return None;
        }
        let existing = self.local.peek(key)?;
        metrics::counter!("norepeat_fallback_hits_total").increment(1);
        Some(existing)
    }

    /// The primary store.
    #[must_use]
    pub fn primary(&self) -> &S {
        &self.primary
    }

    /// The local fallback.
    #[must_use]
    pub fn local(&self) -> &MemoryStore {
        &self.local
    }

    fn degraded(&self, e: &StoreError) {
        metrics::counter!("norepeat_fallback_decisions_total").increment(1);
        tracing::debug!(error = %e, "store unavailable: deciding against the local fallback");
    }
}

impl<S: KeyValueStore> KeyValueStore for Fallback<S> {
    async fn execute(&self, op: KeyOp<'_>) -> Result<KeyReply, StoreError> {
        Ok(self.execute_decided(op).await?.0)
    }

    /// A claim (`PutIfAbsent`) the primary failed, and a change it failed
    /// that the local memory made, are the local memory's decisions
    /// ([`DecidedBy::LocalMemory`]); every other answer is the primary's.
    async fn execute_decided(&self, op: KeyOp<'_>) -> Result<(KeyReply, DecidedBy), StoreError> {
        let by_store = |reply: Result<KeyReply, StoreError>| Ok((reply?, DecidedBy::Store));
        let Some(recent) = self.recent.as_deref() else {
            // Disabled: the primary's answer, or its failure.
            return by_store(self.primary.execute(op).await);
        };
        // Entries the primary's answer creates are counted from before it
        // was asked: they end no later than the primary's own copies.
        let asked_ms = self.now_ms();
        match op {
            KeyOp::PutIfAbsent {
                key, value, ttl, ..
            } => match self.primary.execute(op).await {
                Err(e) => {
                    self.degraded(&e);
                    let local = DecidedBy::LocalMemory;
                    if let Some(held) = recent.get(key, self.now_ms()) {
                        // Taken through the primary before it failed.
                        metrics::counter!("norepeat_fallback_hits_total").increment(1);
                        return Ok((KeyReply::Held(Some(held)), local));
                    }
                    self.hold_locally(ttl);
                    let reply = self.local.execute(op).await?;
                    if let KeyReply::Held(Some(_)) = &reply {
                        // A repeat caught by the local memory during an outage.
                        metrics::counter!("norepeat_fallback_hits_total").increment(1);
                    }
                    Ok((reply, local))
                }
                Ok(KeyReply::Held(None)) => {
                    let held = self.reconcile(key);
                    if held.is_none() {
                        recent.put(key, value, after(asked_ms, ttl));
                    }
                    Ok((KeyReply::Held(held), DecidedBy::Store))
                }
                held => by_store(held),
            },
            // Releases, renewals and completions go to both stores: the key
            // may live in either. A renewal or a completion that took hold
            // locally keeps the local store consulted for its new TTL.
            // A read is the file's store's answer, or its failure: the
            // local memory decides, it is not asked about what it may miss.
            KeyOp::Get { .. } => by_store(self.primary.execute(op).await),
            KeyOp::DeleteIfEquals { .. }
            | KeyOp::ExpireIfEquals { .. }
            | KeyOp::ReplaceIfEquals { .. } => {
                // Not asked while nothing written there can be alive (no
                // outage for a TTL): the common case, a completion or a
                // release on a healthy store, costs no local lookup.
                let local = self.may_hold_locally()
                    && matches!(self.local.execute(op).await?, KeyReply::Changed(true));
                if local
                    && let KeyOp::ExpireIfEquals { ttl, .. } | KeyOp::ReplaceIfEquals { ttl, .. } =
                        op
                {
                    self.hold_locally(ttl);
                }
                let primary = self.primary.execute(op).await;
                remember_change(recent, op, &primary, asked_ms, self.now_ms());
                match primary {
                    Ok(KeyReply::Changed(p)) => by_store(Ok(KeyReply::Changed(p || local))),
                    Err(_) if local => Ok((KeyReply::Changed(true), DecidedBy::LocalMemory)),
                    other => by_store(other),
                }
            }
        }
    }

    fn kind(&self) -> &'static str {
        self.primary.kind()
    }

    fn reconnect(&self) {
        self.primary.reconnect();
    }

    fn report_late_answers(&self, to: super::LateAnswers) {
        self.primary.report_late_answers(to);
    }
}

/// `ttl` after `from_ms`, on a store's millisecond clock.
fn after(from_ms: u64, ttl: Duration) -> u64 {
    from_ms.saturating_add(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
}

/// Applies an owner-checked operation to the keys remembered from the
/// primary, after the primary answered it. A release forgets the key
/// whatever the primary said (its caller is done with it: a retry must not
/// be refused during an outage); a renewal or a replacement is applied
/// only once the primary made it.
fn remember_change(
    recent: &Recent,
    op: KeyOp<'_>,
    primary: &Result<KeyReply, StoreError>,
    asked_ms: u64,
    now_ms: u64,
) {
    let made = matches!(primary, Ok(KeyReply::Changed(true)));
    let (key, expected, change) = match op {
        KeyOp::DeleteIfEquals { key, expected } => (key, expected, Change::Deleted),
        KeyOp::ExpireIfEquals { key, expected, ttl } if made => {
            let until_ms = after(asked_ms, ttl);
            (key, expected, Change::Expires { until_ms })
        }
        KeyOp::ReplaceIfEquals {
            key,
            expected,
            value,
            ttl,
        } if made => {
            let until_ms = after(asked_ms, ttl);
            (key, expected, Change::Replaced { value, until_ms })
        }
        _ => return,
    };
    recent.changed(key, expected, change, now_ms);
}

impl<S: RateStore> RateStore for Fallback<S> {
    async fn rate(&self, op: RateOp<'_>) -> Result<RateDecision, StoreError> {
        Ok(self.rate_decided(op).await?.0)
    }

    async fn rate_decided(&self, op: RateOp<'_>) -> Result<(RateDecision, DecidedBy), StoreError> {
        match self.primary.rate(op).await {
            Err(e) if self.recent.is_none() => Err(e),
            Err(e) => {
                self.degraded(&e);
                Ok((self.local.rate(op).await?, DecidedBy::LocalMemory))
            }
            Ok(decision) => Ok((decision, DecidedBy::Store)),
        }
    }
}
