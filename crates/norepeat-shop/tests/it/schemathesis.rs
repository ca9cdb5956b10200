//! Schemathesis fuzzes the shop from its own `GET /openapi.json`, on SQLite
//! and on a fresh PostgreSQL database: every operation in examples,
//! coverage, fuzzing and stateful phases (following the document's links:
//! token -> order -> reading, payment -> callback), with `X-User-Id`,
//! `Idempotency-Key` and `Repeat-Token` generated too. It must end with no
//! 5xx, no response outside the document (status, content type, body
//! schema, headers) and no error.
//!
//! Schemathesis comes from PyPI: `./scripts/test.sh` installs it into
//! `.venv/` at the repository's root. `NOREPEAT_SCHEMATHESIS` names another
//! executable. Without one the test fails: a check that did not run is
//! never reported as passed. To leave it out on purpose, filter it out, so
//! nextest counts it as skipped: `cargo nextest run -E 'not test(/^schemathesis::/)'`.

// Test helpers unwrap too: a failure there is a failed test.
use norepeat_testkit::{PgDatabase, ShopProcess};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

/// Test cases per operation and phase (`--max-examples`). There is no
/// `--max-time`: with one, Schemathesis repeats its fuzzing and stateful
/// phases until the time is spent, so each run took its whole budget (100 s)
/// and, on a busy machine, ran fewer cases than one pass of every phase
/// (1119 against 1420, seed 14). One pass is the same cases wherever it
/// runs, in about 35 s on an idle 2-core machine.
const EXAMPLES: &str = "50";
/// The most one run may take before it is killed and the test fails: a
/// deadline only a hang reaches (under nextest's own, 300 s).
const HARD_LIMIT: Duration = Duration::from_secs(280);
/// Fixed seed: a failure is reproduced by running the same command.
const SEED: &str = "14";
/// The checks the run must pass: no 5xx; every answer as the document says
/// (status, content type, body, headers); what the document forbids is
/// refused (values, missing required headers, undocumented methods).
/// `positive_data_acceptance` is left out: a valid-looking order without a
/// repeat token (which may come in a header or the query, so neither is
/// required) or a reused `Idempotency-Key` is rightly refused.
const CHECKS: &str = "not_a_server_error,status_code_conformance,content_type_conformance,\
response_schema_conformance,response_headers_conformance,negative_data_rejection,\
missing_required_header,unsupported_method";

/// The schemathesis executable, or why there is none.
fn schemathesis() -> Result<PathBuf, String> {
    let candidates: Vec<PathBuf> = match std::env::var_os("NOREPEAT_SCHEMATHESIS") {
        Some(p) => vec![PathBuf::from(p)],
        None => vec![
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/schemathesis"),
            PathBuf::from("schemathesis"),
        ],
    };
    for c in &candidates {
        let ok = std::process::Command::new(c)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Ok(c.clone());
        }
    }
    Err(format!(
        "schemathesis not found (tried {candidates:?}). ./scripts/test.sh installs it into .venv/; \
         by hand: python3 -m venv .venv && .venv/bin/pip install schemathesis"
    ))
}

async fn fuzz(database: &str, database_url: String) {
    let exe = schemathesis().unwrap_or_else(|why| {
        panic!("{why} (to leave this test out, filter it: -E 'not test(/^schemathesis::/)')")
    });
    let admin = format!("adm-{}", rand::random::<u64>());
    let shop = ShopProcess::start(
        env!("CARGO_BIN_EXE_norepeat"),
        vec![
            ("DATABASE_URL".into(), database_url),
            ("NOREPEAT_ADMIN_TOKEN".into(), admin.clone()),
        ],
    )
    .await;
    let base = shop.base_url();
    // Enough stock that generated orders are not all out of stock, so the
    // stateful phase reaches payments and callbacks.
    for sku in ["SKU-1", "SKU-2", "SKU-3"] {
        crate::common::set_stock(&base, &admin, sku, 1_000_000_000).await;
    }

    let work = std::env::temp_dir().join(format!("nr-schemathesis-{}", rand::random::<u64>()));
    std::fs::create_dir_all(&work).unwrap();
    let schema = format!("{base}/openapi.json");
    let args = [
        "run",
        schema.as_str(),
        "--checks",
        CHECKS,
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--max-examples",
        EXAMPLES,
        "--seed",
        SEED,
        // One worker: CPython 3.11.7's ast.parse is not thread-safe (it
        // breaks Hypothesis with "AST constructor recursion depth mismatch").
        "--workers",
        "1",
        "--request-timeout",
        "10",
        "--suppress-health-check",
        "all",
        "--generation-database",
        "none",
        "--no-color",
    ];
    eprintln!("[{database}] {} {}", exe.display(), args.join(" "));
    let child = tokio::process::Command::new(&exe)
        .args(args)
        .current_dir(&work)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let out = tokio::time::timeout(HARD_LIMIT, child.wait_with_output()).await;
    let _ = std::fs::remove_dir_all(&work);
    let out = out
        .unwrap_or_else(|_| panic!("[{database}] schemathesis ran over {HARD_LIMIT:?}"))
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}\n{stderr}");
    // The summary's line `  N generated, N passed`.
    let cases = stdout.lines().find_map(|l| {
        let mut words = l.split_whitespace();
        let n = words.next()?.parse::<u64>().ok()?;
        words.next()?.starts_with("generated").then_some(n)
    });
    println!(
        "schemathesis on {database}: {} test cases, seed {SEED}, exit {:?}",
        cases.map_or_else(|| "?".to_owned(), |n| n.to_string()),
        out.status.code()
    );
    drop(shop);
    assert!(
        out.status.success(),
        "[{database}] schemathesis found failures (see its report above)"
    );
    assert!(
        cases.is_some_and(|n| n > 0),
        "[{database}] schemathesis ran no test case"
    );
    // Every phase ran and passed: one that was skipped (no links followed,
    // say) would otherwise still end in exit 0.
    for phase in ["Examples", "Coverage", "Fuzzing", "Stateful"] {
        assert!(
            stdout.lines().any(|l| l.trim() == format!("✅ {phase}")),
            "[{database}] the {phase} phase did not pass in the summary"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_nothing_on_sqlite() {
    let dir = std::env::temp_dir().join(format!("nr-st-sqlite-{}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.join("shop.db").display());
    fuzz("sqlite", url).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_nothing_on_postgres() {
    let db = PgDatabase::fresh().await;
    fuzz("postgres", db.url()).await;
    db.drop_now().await;
}

/// The test command refuses `NOREPEAT_SKIP_SCHEMATHESIS` (it once made both
/// fuzz runs pass without running) before it installs or builds anything.
#[test]
fn the_test_command_refuses_the_old_skip_variable() {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/test.sh");
    // No PATH: were the refusal gone, the script would stop at its first
    // command (exit 127) instead of installing and running the whole suite.
    let out = std::process::Command::new("/bin/bash")
        .arg(&script)
        .env("NOREPEAT_SKIP_SCHEMATHESIS", "1")
        .env("PATH", "/nonexistent")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("NOREPEAT_SKIP_SCHEMATHESIS is set"),
        "{stderr}"
    );
}
