//! The binary's logs on stderr: colour only on a terminal (and never with
//! `NO_COLOR`), plain text in a file, one JSON object per line with
//! `NOREPEAT_LOG_FORMAT=json`.
//!
//! `RUST_LOG=debug` makes the shop log (sqlx logs every statement at debug),
//! so every run here has lines to look at.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_norepeat");
const ESC: &str = "\x1b[";

/// A temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let dir = std::env::temp_dir().join(format!("nr_logs_{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).expect("create a temporary directory");
        TempDir(dir)
    }

    fn database_url(&self) -> String {
        format!("sqlite://{}?mode=rwc", self.0.join("shop.db").display())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `program` in `dir` with a clean logging environment: debug logs, no
/// colour or format settings inherited from whoever runs the tests.
fn command(program: &str, dir: &TempDir) -> Command {
    let mut cmd = Command::new(program);
    cmd.current_dir(&dir.0)
        .env("DATABASE_URL", dir.database_url())
        .env("RUST_LOG", "debug")
        .env_remove("NO_COLOR")
        .env_remove("NOREPEAT_LOG_FORMAT")
        .env_remove("REDIS_URL")
        .env_remove("NATS_URL")
        .stdin(Stdio::null());
    cmd
}

/// Kills the child on drop, so a failed assertion leaves no shop running.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `norepeat serve` with stderr redirected to a file, waits for it to
/// listen, sends it one request, stops it and returns what it logged.
fn serve_logs_to_file(envs: &[(&str, &str)]) -> String {
    let dir = TempDir::new();
    let log_path = dir.0.join("stderr.log");
    let log = File::create(&log_path).expect("create the log file");
    let mut child = Running(
        command(BIN, &dir)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .envs(envs.iter().copied())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn norepeat serve"),
    );
    let stdout = child.0.stdout.take().expect("stdout is piped");
    let mut lines = BufReader::new(stdout).lines();
    let addr = loop {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("norepeat serve exited: {}", read(&log_path)))
            .expect("read stdout");
        if let Some(url) = line.strip_prefix("listening on http://") {
            break url.trim().to_owned();
        }
    };
    // One request, so the log holds request-time lines too, not only start-up.
    let mut conn = TcpStream::connect(&addr).expect("connect to the shop");
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n")
        .expect("send a request");
    let mut answer = String::new();
    conn.read_to_string(&mut answer).expect("read the answer");
    assert!(answer.starts_with("HTTP/1.1 200"), "GET /healthz: {answer}");
    drop(child);
    read(&log_path)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Runs `norepeat reconcile --once` (which logs, then exits) under a
/// pseudo-terminal made by util-linux `script`, and returns the terminal's
/// output: stdout and stderr as the user would see them.
fn reconcile_on_a_terminal(envs: &[(&str, &str)]) -> String {
    let dir = TempDir::new();
    let out = command("script", &dir)
        .envs(envs.iter().copied())
        .args(["--quiet", "--return", "--command"])
        .arg(format!("'{BIN}' reconcile --once"))
        .arg("/dev/null")
        .output()
        .expect("the terminal test needs util-linux `script` on PATH");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "script -c 'norepeat reconcile --once' failed ({}):\n{}{}",
        out.status,
        excerpt(&text),
        excerpt(&String::from_utf8_lossy(&out.stderr))
    );
    assert!(
        text.contains("\"repaired\""),
        "reconcile ran on the terminal:\n{}",
        excerpt(&text)
    );
    text
}

/// The start of `text`, escaped, for a failure message.
fn excerpt(text: &str) -> String {
    let head: String = text.chars().take(1500).collect();
    format!(
        "{}{}",
        head.escape_debug(),
        if head.len() < text.len() { " …" } else { "" }
    )
}

fn log_lines(log: &str) -> Vec<&str> {
    log.lines().filter(|l| !l.trim().is_empty()).collect()
}

/// The issue: `norepeat serve 2>file` filled the file with escape codes.
#[test]
fn text_logs_in_a_file_have_no_colour_codes() {
    let log = serve_logs_to_file(&[]);
    let lines = log_lines(&log);
    assert!(
        lines.iter().any(|l| l.contains("DEBUG")),
        "expected debug lines in the log, got:\n{}",
        excerpt(&log)
    );
    assert!(
        !log.contains(ESC),
        "the log file holds ANSI escape codes:\n{}",
        excerpt(&log)
    );
}

/// `NOREPEAT_LOG_FORMAT=json`: every line is one JSON object with a level, a
/// timestamp and the event's fields.
#[test]
fn json_logs_are_one_object_per_line() {
    let log = serve_logs_to_file(&[("NOREPEAT_LOG_FORMAT", "json")]);
    let lines = log_lines(&log);
    assert!(!lines.is_empty(), "json mode logged nothing");
    assert!(
        !log.contains(ESC),
        "json log holds escape codes:\n{}",
        excerpt(&log)
    );
    for line in &lines {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON line ({e}): {}", excerpt(line)));
        assert!(v.is_object(), "not a JSON object: {}", excerpt(line));
        for field in ["timestamp", "level", "fields", "target"] {
            assert!(v.get(field).is_some(), "no `{field}` in {}", excerpt(line));
        }
    }
    assert!(
        lines.iter().any(|l| l.contains("\"level\":\"DEBUG\"")),
        "expected debug events in:\n{}",
        excerpt(&log)
    );
}

/// On a terminal the text format is coloured; `NO_COLOR` turns it off there
/// too. (Also proves the colour check above can fail.)
#[test]
fn text_logs_on_a_terminal_are_coloured_unless_no_color() {
    let coloured = reconcile_on_a_terminal(&[]);
    assert!(
        coloured.contains(ESC),
        "no colour on a terminal:\n{}",
        excerpt(&coloured)
    );
    let plain = reconcile_on_a_terminal(&[("NO_COLOR", "1")]);
    assert!(
        plain.contains("DEBUG"),
        "expected debug lines on the terminal:\n{}",
        excerpt(&plain)
    );
    assert!(
        !plain.contains(ESC),
        "NO_COLOR=1, yet the terminal got escape codes:\n{}",
        excerpt(&plain)
    );
}

/// An unknown format stops the binary with a clear message before it does
/// anything.
#[test]
fn an_unknown_log_format_is_refused() {
    let dir = TempDir::new();
    let out = command(BIN, &dir)
        .env("NOREPEAT_LOG_FORMAT", "xml")
        .args(["reconcile", "--once"])
        .output()
        .expect("run norepeat");
    assert!(
        !out.status.success(),
        "NOREPEAT_LOG_FORMAT=xml was accepted"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("NOREPEAT_LOG_FORMAT must be `text` or `json`, not `xml`"),
        "stderr: {stderr}"
    );
    assert!(
        !dir.0.join("shop.db").exists(),
        "the database was opened before the format was checked"
    );
}
