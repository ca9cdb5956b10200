//! The gateway's tokens on a plain HTML form in a real browser (issue 38):
//! headless Debian chromium driven by playwright-core runs
//! `tests/browser/gateway_form.test.mjs` against the gateway in front of
//! `tests/backend.py`, whose `GET /form` page fetches a repeat token into a
//! hidden `repeatToken` field and submits an
//! `application/x-www-form-urlencoded` POST: no script sends the order.
//! The caller is a cookie the page sets (`identity: {cookie: sid}`). The
//! README's test command installs chromium and the npm packages; without
//! them this test fails, it is never skipped.

use crate::common::*;
use std::path::PathBuf;

/// The repository's root (the gateway crate is two levels down).
fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `tests/browser/SCRIPT` in headless Chromium with `args` (the
/// gateway's and backends' URLs) and fails with its output unless it
/// passes. Chromium and the npm packages are the README's test command's
/// to install; without them this fails, it is never skipped.
pub(crate) async fn run_browser_script(script: &str, args: &[String]) {
    let browser_dir = repo_root().join("tests/browser");
    let how = "run ./scripts/test.sh (or tests/browser/run.sh --install)";
    assert!(
        std::path::Path::new("/usr/bin/chromium").exists(),
        "the browser test needs Debian's chromium: {how}"
    );
    assert!(
        browser_dir.join("node_modules/playwright-core").exists(),
        "the browser test needs tests/browser/node_modules: {how}"
    );
    let run = Command::new("node")
        .arg(browser_dir.join(script))
        .args(args)
        .current_dir(&browser_dir)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the browser test finishes within 2 minutes")
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(
        out.status.success(),
        "{script} failed ({}):\n{stdout}{stderr}",
        out.status
    );
}

#[tokio::test]
async fn a_plain_form_submits_its_token_once_in_a_real_browser() {
    let b = backend(0).await;
    let yaml = format!(
        "upstream: http://127.0.0.1:{}\nidentity: {{ cookie: sid, required: true }}\nroutes:\n  - match: POST /orders\n    guard: token\n",
        b.port
    );
    let g = gateway(&yaml).await;
    run_browser_script("gateway_form.test.mjs", &[url(&g, ""), url(&b, "")]).await;
    assert_eq!(effects(&b).await["/orders"], 2);
}

/// `on_repeat: replay` in a real browser (issue 51): on a form whose slow
/// order service answers 303 to the order's page, a click, two clicks and
/// a double click each make one order and end on its page
/// (`tests/browser/gateway_replay.test.mjs`). Before (no `on_repeat`):
/// the second click's page was the 409 refusal, while its order had been
/// made, and the test timed out waiting for the order's page.
#[tokio::test]
async fn a_second_click_ends_on_the_orders_page_in_a_real_browser() {
    let b = backend(0).await;
    let yaml = format!(
        "upstream: http://127.0.0.1:{}\nidentity: {{ cookie: sid, required: true }}\nroutes:\n  - match: POST /slow-orders\n    guard: token\n    on_repeat: replay\n",
        b.port
    );
    let g = gateway(&yaml).await;
    run_browser_script("gateway_replay.test.mjs", &[url(&g, ""), url(&b, "")]).await;
    assert_eq!(effects(&b).await["/slow-orders"], 3);
}
