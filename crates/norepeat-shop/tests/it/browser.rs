//! The shop's web page in a real browser: runs `tests/browser/page.test.mjs`
//! (headless Debian chromium driven by playwright-core) against the built
//! `norepeat` binary on a temporary SQLite database, with a slow payment
//! provider (`NOREPEAT_PAYMENT_LATENCY_MS`) and every order event published
//! three times (`NOREPEAT_DUPLICATE_EVENTS`), as `tests/browser/run.sh` does.
//!
//! Needs `node`, `/usr/bin/chromium` (or `$CHROMIUM`) and
//! `tests/browser/node_modules`; the README's test command installs them
//! (`tests/browser/run.sh --install`). When they are missing these tests fail,
//! they do not skip.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use norepeat_testkit::ShopProcess;

/// Longest one run of the browser test may take.
const NODE_TIMEOUT: Duration = Duration::from_secs(200);

/// The fake payment provider's latency: slow enough that a double click
/// lands while the first payment still runs.
const PAYMENT_LATENCY_MS: &str = "400";

/// Every `order.paid` event is published this many times: the points must
/// still arrive once.
const DUPLICATE_EVENTS: &str = "3";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root exists")
}

/// Panics, naming what is missing, unless node, chromium and the npm packages are there.
fn require_tools(browser_dir: &Path) {
    let how = "run the README's test command, which installs them \
               (or `tests/browser/run.sh --install`)";
    let node = std::process::Command::new("node")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    assert!(
        node.is_ok_and(|s| s.success()),
        "the browser test needs `node` (Node.js 20+) on PATH: {how}"
    );
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_owned());
    assert!(
        Path::new(&chromium).exists(),
        "the browser test needs Debian's chromium at {chromium}: {how}"
    );
    assert!(
        browser_dir
            .join("node_modules/playwright-core/package.json")
            .exists(),
        "the browser test needs {}/node_modules (playwright-core): {how}",
        browser_dir.display()
    );
}

/// A temporary directory for the shop's database, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let dir = std::env::temp_dir().join(format!("nr_browser_{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).expect("create a temporary directory");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts a shop on a fresh SQLite file and runs the page test against it
/// with `extra_args`; panics with the test's output unless it exits 0.
async fn run_page_test(extra_args: &[&str]) {
    let browser_dir = repo_root().join("tests/browser");
    require_tools(&browser_dir);
    let db = TempDir::new();
    let shop = ShopProcess::start(
        env!("CARGO_BIN_EXE_norepeat"),
        vec![
            (
                "DATABASE_URL".to_owned(),
                format!("sqlite://{}?mode=rwc", db.0.join("shop.db").display()),
            ),
            (
                "NOREPEAT_PAYMENT_LATENCY_MS".to_owned(),
                PAYMENT_LATENCY_MS.to_owned(),
            ),
            (
                "NOREPEAT_DUPLICATE_EVENTS".to_owned(),
                DUPLICATE_EVENTS.to_owned(),
            ),
        ],
    )
    .await;
    let run = tokio::process::Command::new("node")
        .arg(browser_dir.join("page.test.mjs"))
        .arg(shop.base_url())
        .args(extra_args)
        .current_dir(&browser_dir)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(NODE_TIMEOUT, run)
        .await
        .unwrap_or_else(|_| panic!("the browser test did not finish within {NODE_TIMEOUT:?}"))
        .expect("spawn node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(
        out.status.success(),
        "node tests/browser/page.test.mjs {} {} failed ({}):\n{stdout}{stderr}",
        shop.base_url(),
        extra_args.join(" "),
        out.status
    );
}

/// The page's whole flow. Orders: the page fetches a token on load, sends
/// it, disables the button while submitting and fetches a new one after every
/// submit: five fast clicks make one order (also with the button guard
/// bypassed), a second order works. Payments: a double click on Pay under a
/// slow network makes one payment; a payment whose answer is lost (network
/// error) or late (the page's timeout) is retried with the same
/// `Idempotency-Key` and replayed; the provider's notices, sent many times,
/// make the order PAID and award its points once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_follows_the_whole_flow_in_a_real_browser() {
    run_page_test(&[]).await;
}

/// With `?brokenTokenFlow=1` the page resends its old token; the same checks
/// must then fail (the script exits 0 only if they do), so the browser test
/// is known to be able to fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_test_fails_when_the_page_resends_an_old_token() {
    run_page_test(&["--expect-broken"]).await;
}

/// With `?brokenPaymentRetry=1` the page retries a payment with a new
/// `Idempotency-Key` each time; the retry check must then fail (the shop runs
/// a second payment attempt instead of replaying), so the test is known to
/// catch a page that loses its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_test_fails_when_the_page_retries_a_payment_with_a_new_key() {
    run_page_test(&["--expect-broken-payment"]).await;
}
