//! Finding a Redis master through Sentinel, and finding it again.
//!
//! The lookup is redis-rs's (`redis::sentinel::Sentinel`, feature
//! `sentinel`): it asks the Sentinels for their masters, takes the first
//! one of the name that no Sentinel marks down, and checks with `ROLE`
//! that the server there calls itself master. What redis-rs does not do is
//! follow the master once connected (its `SentinelClient` hands out
//! connections to the master of the moment, and they stay where they are):
//! the store's own pool does that ([`RedisStore`](super::RedisStore)), so
//! that its batching (see [`batch`](super::batch)) works the same on a
//! Sentinel's master as on one Redis. When a call on the master fails
//! without an answer, or is answered `READONLY` (the master was demoted),
//! the pool asks [`Discovery::master`] again, and when the master moved it
//! replaces every connection: the old master's are dropped.

use super::url::SentinelUrl;
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{Client, IntoConnectionInfo, RedisError, RedisResult, TlsMode};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long one lookup may take in all (every Sentinel asked, the master
/// checked): a Sentinel that does not answer must not hold the pool's
/// next lookup for ever.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

/// The fewest milliseconds between two lookups: a storm of failed calls
/// (every call while the master is down) asks for one lookup per gap.
pub(super) const LOOKUP_GAP: Duration = Duration::from_millis(100);

/// The Sentinels of one master, and whether a lookup is running or asked
/// for.
pub(super) struct Discovery {
    sentinel: tokio::sync::Mutex<Sentinel>,
    master: String,
    settings: SentinelNodeConnectionInfo,
    /// A lookup task is running.
    busy: AtomicBool,
    /// A lookup was asked for since the last one began.
    stale: AtomicBool,
}

impl Discovery {
    /// The Sentinels and master `url` names; nothing is sent yet.
    pub(super) fn new(url: &SentinelUrl) -> RedisResult<Self> {
        let master = url.master_settings.as_str().into_connection_info()?;
        let mut settings = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(master.redis_settings().clone());
        if url.master_settings.starts_with("rediss://") {
            settings = settings.set_tls_mode(TlsMode::Secure);
        }
        Ok(Self {
            sentinel: tokio::sync::Mutex::new(Sentinel::build(url.sentinels.clone())?),
            master: url.master.clone(),
            settings,
            busy: AtomicBool::new(false),
            stale: AtomicBool::new(false),
        })
    }

    /// A client for the master the Sentinels name now (checked with
    /// `ROLE`). One lookup at a time: a second caller waits for the first.
    pub(super) async fn master(&self) -> RedisResult<Client> {
        let lookup = async {
            let mut sentinel = self.sentinel.lock().await;
            sentinel
                .async_master_for(&self.master, Some(&self.settings))
                .await
        };
        tokio::time::timeout(LOOKUP_TIMEOUT, lookup)
            .await
            .unwrap_or_else(|_| {
                Err(RedisError::from((
                    redis::ErrorKind::Io,
                    "the Sentinels did not name a master in time",
                    format!("{} ms", LOOKUP_TIMEOUT.as_millis()),
                )))
            })
    }

    /// Asks for a lookup; `true` when the caller must start the task that
    /// runs them (none is running), which loops while [`again`](Self::again).
    pub(super) fn ask(&self) -> bool {
        // SeqCst on both flags, both sides: each side writes one flag and
        // then reads the other (as the cluster's map refresh does).
        self.stale.store(true, Ordering::SeqCst);
        !self.busy.swap(true, Ordering::SeqCst)
    }

    /// Whether the lookup task must look again (asked since it last
    /// began); `false` ends the task.
    pub(super) fn again(&self) -> bool {
        if self.stale.swap(false, Ordering::SeqCst) {
            return true;
        }
        self.busy.store(false, Ordering::SeqCst);
        // Asked between the check and the store: take it on, unless a new
        // task already did.
        self.stale.load(Ordering::SeqCst) && !self.busy.swap(true, Ordering::SeqCst)
    }

    /// The master's name, for logs.
    pub(super) fn name(&self) -> &str {
        &self.master
    }
}

/// Whether `answer` says the master may have moved: no answer at all (a
/// refused or broken connection, a timeout), or `READONLY` (a write that
/// reached a master demoted to replica).
pub(super) fn may_have_moved(answer: &RedisResult<redis::Value>) -> bool {
    let Err(e) = answer else { return false };
    match e.code() {
        Some(code) => code == "READONLY",
        None => {
            e.is_io_error()
                || e.is_connection_dropped()
                || e.is_connection_refusal()
                || e.is_timeout()
        }
    }
}
