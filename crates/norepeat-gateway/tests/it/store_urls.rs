//! `store:` takes every Redis URL the library does (one Redis, Sentinel,
//! Cluster, each with `?replicas=N&replicas_timeout=T`), and
//! `norepeat-gateway check` refuses a bad one naming the field, its line
//! and what is wrong, with nothing sent to any store.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const GATEWAY: &str = env!("CARGO_BIN_EXE_norepeat-gateway");
const UP: &str = "upstream: http://127.0.0.1:9000\n";

fn check(name: &str, store: &str) -> (PathBuf, Output) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("norepeat-gateway-store-urls");
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, format!("{UP}store: {store}\n")).expect("write");
    let out = Command::new(GATEWAY)
        .arg("check")
        .arg(&path)
        .env_remove("NOREPEAT_GATEWAY_TOKEN_SECRET")
        .output()
        .expect("the binary runs");
    (path, out)
}

/// The new URLs pass `check` (nothing is connected to: no Sentinel listens
/// on these ports). Before: `unknown store "redis+sentinel"`, and a
/// cluster URL with a query was refused.
#[test]
fn sentinel_and_replicas_urls_are_ok() {
    for (i, url) in [
        "redis+sentinel://127.0.0.1:1,127.0.0.1:2/mymaster",
        "redis+sentinel://:pw@s1:26379,s2:26379,s3:26379/mymaster?replicas=1",
        "rediss+sentinel://s1:26379/mymaster",
        "redis://127.0.0.1:6379/0?replicas=1&replicas_timeout=50ms",
        "redis+cluster://a:7000,b:7001?replicas=1&replicas_timeout=1s",
    ]
    .into_iter()
    .enumerate()
    {
        let (_, out) = check(&format!("ok{i}"), url);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{url}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A bad Sentinel URL or an unknown query parameter: exit 2, one line
/// naming the file, the line and column, `store`, and what is wrong; a
/// password never shows.
#[test]
fn a_bad_store_url_is_refused_naming_the_field() {
    for (name, url, says) in [
        (
            "misspelt",
            "redis://:hunter2@127.0.0.1:6379?replica=1",
            "unknown query parameter \"replica\"",
        ),
        (
            "timeout_alone",
            "redis+cluster://a:7000?replicas_timeout=5ms",
            "replicas_timeout without replicas",
        ),
        (
            "too_long",
            "redis+sentinel://s1:26379/m?replicas=1&replicas_timeout=5s",
            "must be between 1ms and 1000ms",
        ),
        (
            "no_master",
            "redis+sentinel://s1:26379",
            "no master name after the Sentinels",
        ),
        (
            "bad_sentinel",
            "redis+sentinel://s1:port/m",
            "Sentinel \"port\" is not a port",
        ),
    ] {
        let (path, out) = check(name, url);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        let prefix = format!("{}:2:8: store: ", path.display());
        assert!(err.starts_with(&prefix), "{name}: {err}");
        assert!(err.contains(says), "{name}: {err}");
        assert!(!err.contains("hunter2"), "{name}: {err}");
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
    }
}
