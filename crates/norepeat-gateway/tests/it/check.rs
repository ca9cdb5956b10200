//! `norepeat-gateway check FILE`, run as a user runs it: the binary, on
//! files on disk.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const GATEWAY: &str = env!("CARGO_BIN_EXE_norepeat-gateway");

fn check(file: &Path) -> Output {
    Command::new(GATEWAY)
        .arg("check")
        .arg(file)
        .env_remove("NOREPEAT_GATEWAY_TOKEN_SECRET")
        .output()
        .expect("the binary runs")
}

/// Writes `bytes` to a file of its own under the test's tmp dir.
fn file(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("norepeat-gateway-check");
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write");
    path
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn the_walk_through_example_is_ok() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/gateway.yaml");
    let out = check(&path);
    assert_eq!(text(&out.stdout), "ok: 5 routes\n", "{}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stderr), "");
}

const UP: &str = "upstream: http://127.0.0.1:9000\n";

/// A file and the line its one problem must start with, after the file's
/// path.
fn malformed() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let route =
        |fields: &str| format!("{UP}routes:\n  - match: POST /orders\n{fields}").into_bytes();
    vec![
        (
            "unknown_field",
            route("    guard: token\n    retries: 3\n"),
            ":5:5: routes[0].retries: unknown field; expected one of match, host, content_type, guard,",
        ),
        (
            "bad_duration",
            route("    guard: fingerprint\n    window: 3 parsecs\n"),
            ":5:13: routes[0].window: expected a duration above zero such as 250ms, 3s, 5m or 24h, not \"3 parsecs\"",
        ),
        (
            "bad_rate",
            route("    rate_limit: { rate: 5/fortnight }\n"),
            ":4:25: routes[0].rate_limit.rate: the unit of a rate must be s, m or h, not \"fortnight\"",
        ),
        (
            "bad_match",
            format!("{UP}routes:\n  - match: POST /orders/{{id\n    guard: token\n").into_bytes(),
            ":3:12: routes[0].match: \"{id\" in \"/orders/{id\": a {name} must be a whole segment",
        ),
        (
            "bad_method",
            format!("{UP}routes:\n  - match: SEND /orders\n    guard: token\n").into_bytes(),
            ":3:12: routes[0].match: unknown method \"SEND\"; expected one of GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS",
        ),
        (
            "short_secret",
            format!("{UP}token_secret: too-short\n").into_bytes(),
            ":2:15: token_secret: a token secret needs at least 32 bytes, this one has 9",
        ),
        (
            "bad_store_url",
            format!("{UP}store: memcached://127.0.0.1:11211\n").into_bytes(),
            ":2:8: store: unknown store \"memcached\"; expected memory,",
        ),
        (
            "bad_cidr",
            format!("{UP}identity:\n  trusted_proxies: [10.0.0.0/8, 10.0.0/8]\n").into_bytes(),
            ":3:33: identity.trusted_proxies[1]: expected an address or a CIDR such as 10.0.0.0/8, not \"10.0.0/8\"",
        ),
        (
            "missing_upstream",
            b"listen: 127.0.0.1:8090\nroutes: []\n".to_vec(),
            ":1:1: upstream: missing; it is required (http://host:port)",
        ),
        (
            "missing_match",
            format!("{UP}routes:\n  - guard: token\n").into_bytes(),
            ":3:5: routes[0].match: missing; every route needs one (METHOD PATH)",
        ),
        (
            "conflicting_fields",
            route("    guard: idempotency\n    ignore_fields: [traceId]\n"),
            ":5:20: routes[0].ignore_fields: only a fingerprint route has ignore_fields (this route's guard is idempotency)",
        ),
        (
            "neither_guard_nor_rate_limit",
            route("    shadow: true\n"),
            ":3:5: routes[0]: a route needs a guard, a rate_limit or an upstream of its own",
        ),
        (
            "yaml_syntax_error",
            format!("{UP}routes:\n  - match: [POST /orders\n").into_bytes(),
            ":4:1: YAML syntax: ",
        ),
        (
            "empty_file",
            Vec::new(),
            ":1: upstream: missing (the file is empty); it is required",
        ),
        (
            "non_utf8",
            b"upstream: http://127.0.0.1:9000\nlisten: caf\xe9\n".to_vec(),
            ":2:12: the file is not UTF-8 (byte 0xe9 at offset 43)",
        ),
    ]
}

#[test]
fn every_malformed_file_exits_2_naming_file_line_and_field() {
    for (name, bytes, want) in malformed() {
        let path = file(&format!("{name}.yaml"), &bytes);
        let out = check(&path);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert_eq!(text(&out.stdout), "", "{name}: nothing on stdout");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{name}: one problem, one line: {err}");
        let prefix = format!("{}{want}", path.display());
        assert!(
            lines[0].starts_with(&prefix),
            "{name}:\n got  {}\n want {prefix}",
            lines[0]
        );
    }
}

#[test]
fn every_problem_of_a_file_gets_its_line() {
    let path = file(
        "many.yaml",
        b"upstream: ftp://x\nstore: nope\nroutes:\n  - match: POST /a\n    guard: token\n    window: 3s\n  - match: GET /b\n    rate_limit: { rate: 0/s }\nlisten: 1\n",
    );
    let out = check(&path);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    let fields: Vec<&str> = err
        .lines()
        .map(|l| {
            let rest = l
                .strip_prefix(&*path.display().to_string())
                .expect("file first");
            rest.splitn(4, ':')
                .nth(3)
                .and_then(|r| r.split(':').next())
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(
        fields,
        [
            " upstream",
            " store",
            " routes[0].window",
            " routes[1].rate_limit.rate",
            " listen"
        ],
        "{err}"
    );
}

#[test]
fn an_unreadable_file_exits_2() {
    let out = check(Path::new("/nonexistent/gateway.yaml"));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).starts_with("/nonexistent/gateway.yaml: cannot read the file: "),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn the_secret_may_come_from_the_environment() {
    let path = file("no_secret.yaml", UP.as_bytes());
    let run = |secret: &str| {
        Command::new(GATEWAY)
            .arg("check")
            .arg(&path)
            .env("NOREPEAT_GATEWAY_TOKEN_SECRET", secret)
            .output()
            .expect("the binary runs")
    };
    let ok = run(&"s".repeat(32));
    assert_eq!(text(&ok.stdout), "ok: 0 routes\n");
    let short = run("short");
    assert_eq!(short.status.code(), Some(2));
    assert_eq!(
        text(&short.stderr),
        "NOREPEAT_GATEWAY_TOKEN_SECRET: a token secret needs at least 32 bytes, this one has 5\n"
    );
}

#[test]
fn the_cli_offers_serving_and_check_and_a_bad_file_never_serves() {
    let help = Command::new(GATEWAY).arg("--help").output().expect("runs");
    assert_eq!(help.status.code(), Some(0));
    let help = text(&help.stdout);
    for offered in ["check", "--config <FILE>", "--listen <ADDR>"] {
        assert!(help.contains(offered), "{offered}: {help}");
    }
    // A file that cannot be read is refused before anything listens.
    let serve = Command::new(GATEWAY)
        .args(["--config", "no-such-gateway.yaml"])
        .output()
        .expect("runs");
    assert_eq!(serve.status.code(), Some(2));
    assert!(text(&serve.stdout).is_empty());
    assert!(
        text(&serve.stderr).starts_with("no-such-gateway.yaml: cannot read the file: "),
        "{}",
        text(&serve.stderr)
    );
    // Neither a command nor --config: told what to give.
    let none = Command::new(GATEWAY).output().expect("runs");
    assert_eq!(none.status.code(), Some(2));
}
