//! What a Redis URL says beyond the server's address: the store's own
//! settings in its query (`replicas`, `replicas_timeout`), and the parts of
//! a Sentinel URL (`redis+sentinel://host:port,host:port/MASTER_NAME`).
//!
//! The store's settings are read here and taken out of the URL before
//! redis-rs reads it, so a query parameter neither of them knows is an
//! error (a misspelt `replica=1` would otherwise be dropped, and the store
//! would run without the guarantee its user asked for).

use std::time::Duration;

/// How many replicas must have a claim (or a completion) before its
/// caller is told it happened, and how long the master waits for them:
/// `WAIT count timeout` after the write, on its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Replicas {
    pub(crate) count: u32,
    pub(crate) timeout: Duration,
}

/// The wait when `replicas` is given without `replicas_timeout`: one
/// replication round trip on a local network is well under a millisecond,
/// and a guard's default budget (300 ms) must leave room for the rest.
pub(crate) const DEFAULT_REPLICAS_TIMEOUT: Duration = Duration::from_millis(100);

/// The longest `replicas_timeout`: under a connection's response timeout
/// (2 s), so that a wait that runs out is answered, not cut.
pub(crate) const LONGEST_REPLICAS_TIMEOUT: Duration = Duration::from_secs(1);

/// The query parameters the store reads itself.
const OURS: [&str; 2] = ["replicas", "replicas_timeout"];

/// `url` without the store's own query parameters (for redis-rs), and the
/// [`Replicas`] they ask for (`None`: no wait, as `replicas=0`). `passed`
/// names the parameters the URL may carry for redis-rs; any other is an
/// error that names it.
pub(crate) fn split_settings<'a>(
    url: &'a str,
    passed: &[&str],
) -> Result<(std::borrow::Cow<'a, str>, Option<Replicas>), String> {
    let (head, fragment) = url
        .split_once('#')
        .map_or((url, None), |(h, f)| (h, Some(f)));
    let Some((base, query)) = head.split_once('?') else {
        return Ok((std::borrow::Cow::Borrowed(url), None));
    };
    let mut count = None;
    let mut timeout = None;
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "replicas" => {
                count = Some(value.parse::<u32>().map_err(|_| {
                    format!("replicas={value:?} is not a number of replicas (0 or more)")
                })?);
            }
            "replicas_timeout" => timeout = Some(parse_timeout(value)?),
            _ if passed.contains(&name) => kept.push(pair),
            _ => {
                let known = OURS
                    .iter()
                    .chain(passed)
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(format!("unknown query parameter {name:?} (known: {known})"));
            }
        }
    }
    let replicas = match (count, timeout) {
        (None, Some(_)) => {
            return Err("replicas_timeout without replicas (say how many, e.g. replicas=1)".into());
        }
        (None | Some(0), _) => None,
        (Some(count), timeout) => Some(Replicas {
            count,
            timeout: timeout.unwrap_or(DEFAULT_REPLICAS_TIMEOUT),
        }),
    };
    if count.is_none() && timeout.is_none() {
        return Ok((std::borrow::Cow::Borrowed(url), None));
    }
    let mut rest = base.to_owned();
    if !kept.is_empty() {
        rest.push('?');
        rest.push_str(&kept.join("&"));
    }
    if let Some(f) = fragment {
        rest.push('#');
        rest.push_str(f);
    }
    Ok((std::borrow::Cow::Owned(rest), replicas))
}

/// `50ms`, `1s`, or a number of milliseconds; between 1 ms and
/// [`LONGEST_REPLICAS_TIMEOUT`] (`WAIT` with 0 would wait for ever).
fn parse_timeout(value: &str) -> Result<Duration, String> {
    let bad = || format!("replicas_timeout={value:?} is not a time such as 50ms or 1s");
    let t = if let Some(ms) = value.strip_suffix("ms") {
        Duration::from_millis(ms.parse().map_err(|_| bad())?)
    } else if let Some(s) = value.strip_suffix('s') {
        Duration::from_secs(s.parse().map_err(|_| bad())?)
    } else {
        Duration::from_millis(value.parse().map_err(|_| bad())?)
    };
    if t.is_zero() || t > LONGEST_REPLICAS_TIMEOUT {
        return Err(format!(
            "replicas_timeout={value:?} must be between 1ms and {}ms",
            LONGEST_REPLICAS_TIMEOUT.as_millis()
        ));
    }
    Ok(t)
}

/// The schemes of a Sentinel URL (the second: TLS, as `rediss://`).
pub(crate) const SENTINEL_SCHEMES: [&str; 2] = ["redis+sentinel://", "rediss+sentinel://"];

/// Whether `url` names its master through Sentinel.
pub(crate) fn is_sentinel(url: &str) -> bool {
    SENTINEL_SCHEMES.iter().any(|s| url.starts_with(s))
}

/// A Sentinel URL's parts.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SentinelUrl {
    /// `redis://host:port` (or `rediss://`) of each Sentinel.
    pub(crate) sentinels: Vec<String>,
    /// The name the Sentinels know the master by.
    pub(crate) master: String,
    /// `redis://[user:password@]localhost` (or `rediss://`): the
    /// master's credentials and TLS, its address left for the Sentinels to
    /// say.
    pub(crate) master_settings: String,
    pub(crate) replicas: Option<Replicas>,
}

/// Reads `redis+sentinel://[user:password@]host:port,host:port/MASTER_NAME[?replicas=N&replicas_timeout=T]`.
/// The credentials are the master's (and its replicas'); the Sentinels
/// are asked without them.
pub(crate) fn sentinel(url: &str) -> Result<SentinelUrl, String> {
    let (scheme, rest) = if let Some(rest) = url.strip_prefix(SENTINEL_SCHEMES[0]) {
        ("redis://", rest)
    } else if let Some(rest) = url.strip_prefix(SENTINEL_SCHEMES[1]) {
        ("rediss://", rest)
    } else {
        return Err("not a Sentinel URL".into());
    };
    let (rest, replicas) = split_settings(rest, &[])?;
    if rest.contains('#') {
        return Err("a Sentinel URL has no fragment".into());
    }
    let (auth, rest) = match rest.rsplit_once('@') {
        Some((auth, rest)) => (Some(auth), rest),
        None => (None, &*rest),
    };
    let (hosts, master) = rest
        .split_once('/')
        .ok_or("no master name (it follows the Sentinels: /MASTER_NAME)")?;
    let master = master.strip_suffix('/').unwrap_or(master);
    if master.is_empty() {
        return Err("no master name (it follows the Sentinels: /MASTER_NAME)".into());
    }
    if master.contains('/') {
        return Err(format!(
            "{master:?} is not a master name (a Sentinel URL has no database)"
        ));
    }
    let sentinels: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| format!("{scheme}{h}"))
        .collect();
    if sentinels.is_empty() {
        return Err("no Sentinel".into());
    }
    let master_settings = match auth {
        Some(auth) => format!("{scheme}{auth}@localhost"),
        None => format!("{scheme}localhost"),
    };
    Ok(SentinelUrl {
        sentinels,
        master: master.to_owned(),
        master_settings,
        replicas,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replicas(count: u32, ms: u64) -> Option<Replicas> {
        Some(Replicas {
            count,
            timeout: Duration::from_millis(ms),
        })
    }

    #[test]
    fn the_stores_settings_leave_the_url() {
        let split = |u| split_settings(u, &["protocol"]);
        assert_eq!(
            split("redis://h:1/0?replicas=1&replicas_timeout=50ms").unwrap(),
            ("redis://h:1/0".into(), replicas(1, 50))
        );
        assert_eq!(
            split("redis://h:1?protocol=resp3&replicas=2").unwrap(),
            ("redis://h:1?protocol=resp3".into(), replicas(2, 100))
        );
        assert_eq!(
            split("redis://h:1?replicas=1&replicas_timeout=1s")
                .unwrap()
                .1,
            replicas(1, 1000)
        );
        assert_eq!(
            split("redis://h:1?replicas=0").unwrap(),
            ("redis://h:1".into(), None)
        );
        assert_eq!(
            split("redis://h:1?protocol=3").unwrap(),
            ("redis://h:1?protocol=3".into(), None)
        );
        assert_eq!(split("redis://h:1").unwrap(), ("redis://h:1".into(), None));
    }

    #[test]
    fn a_setting_not_understood_is_an_error_that_names_it() {
        let split = |u| split_settings(u, &["protocol"]);
        for (url, says) in [
            ("redis://h:1?replica=1", "\"replica\""),
            ("redis://h:1?replicas=one", "replicas="),
            ("redis://h:1?replicas=-1", "replicas="),
            ("redis://h:1?replicas=1&replicas_timeout=0ms", "between"),
            ("redis://h:1?replicas=1&replicas_timeout=5s", "between"),
            ("redis://h:1?replicas=1&replicas_timeout=soon", "not a time"),
            ("redis://h:1?replicas_timeout=5ms", "without replicas"),
        ] {
            let e = split(url).expect_err(url);
            assert!(e.contains(says), "{url}: {e}");
        }
    }

    #[test]
    fn sentinel_urls_name_their_sentinels_and_master() {
        assert_eq!(
            sentinel(
                "redis+sentinel://u:p%40ss@10.0.0.1:26379, 10.0.0.2:26379/mymaster?replicas=1"
            )
            .unwrap(),
            SentinelUrl {
                sentinels: vec![
                    "redis://10.0.0.1:26379".into(),
                    "redis://10.0.0.2:26379".into()
                ],
                master: "mymaster".into(),
                master_settings: "redis://u:p%40ss@localhost".into(),
                replicas: replicas(1, 100),
            }
        );
        let tls = sentinel("rediss+sentinel://h:1/m/").unwrap();
        assert_eq!(tls.sentinels, ["rediss://h:1"]);
        assert_eq!(tls.master_settings, "rediss://localhost");
        for bad in [
            "redis+sentinel://h:1",
            "redis+sentinel://h:1/",
            "redis+sentinel:///m",
            "redis+sentinel://h:1/m/0",
            "redis+sentinel://h:1/m?db=1",
            "redis+sentinel://h:1/m#x",
            "redis://h:1/m",
        ] {
            assert!(sentinel(bad).is_err(), "{bad}");
        }
    }
}
