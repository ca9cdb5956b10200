//! The `gateway` defence: `norepeat-gateway` processes in front of naive
//! shops, sharing one Redis, each on a file written for the run. Also used
//! by the bench's `gateway.*` rows to start a gateway.
//!
//! The file guards the shop's order routes as a team putting the gateway in
//! front of an unguarded service would, for the way its clients call them
//! (`SHOP_API.md`): `POST /orders` carries a page token (`Repeat-Token`,
//! now issued by the gateway's `GET /.norepeat/token`), `POST /orders/quick`
//! nothing but its body (the fingerprint), `POST /payments` an
//! `Idempotency-Key`. The token secret is given in the file, so both
//! instances sign alike from their first request.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The environment variable naming the gateway binary.
pub(crate) const BIN_ENV: &str = "NOREPEAT_GATEWAY_BIN";

/// How long a gateway may take to print its `listening on` line.
const START_DEADLINE: Duration = Duration::from_secs(30);

/// Lines of a gateway's stderr kept to explain a failed start.
const KEPT_LINES: usize = 20;

/// The gateway binary: `NOREPEAT_GATEWAY_BIN`, else `norepeat-gateway`
/// next to this executable.
///
/// # Errors
/// When the binary is not there, naming both places.
pub(crate) fn binary() -> Result<PathBuf, String> {
    locate(
        std::env::var_os(BIN_ENV),
        std::env::current_exe().ok().as_deref(),
    )
}

/// [`binary`] for a given `NOREPEAT_GATEWAY_BIN` value and executable.
fn locate(env: Option<std::ffi::OsString>, exe: Option<&Path>) -> Result<PathBuf, String> {
    let sibling = exe.and_then(|exe| exe.parent().map(|d| d.join("norepeat-gateway")));
    let named = env.filter(|v| !v.is_empty()).map(PathBuf::from);
    match named.as_ref().or(sibling.as_ref()) {
        Some(p) if p.is_file() => Ok(p.clone()),
        _ => Err(format!(
            "the gateway binary is missing: looked for {BIN_ENV} ({}) and for {} (build it with `cargo build -p norepeat-gateway`)",
            named.map_or_else(
                || "unset".to_owned(),
                |n| format!("{} not found", n.display())
            ),
            sibling.map_or_else(
                || "norepeat-gateway next to this executable".to_owned(),
                |s| s.display().to_string()
            ),
        )),
    }
}

/// The file of one storm gateway: `upstream` is its shop, `store` the
/// Redis both instances share, `secret` the run's token secret.
pub(super) fn storm_file(upstream: &str, store: &str, secret: &str) -> String {
    format!(
        r"upstream: {upstream}
store: {store}
token_secret: {secret}
identity:
  header: X-User-Id
  required: true
routes:
  - match: POST /orders
    guard: token
  - match: POST /orders/quick
    guard: fingerprint
    window: 3s
    ignore_fields: [traceId, timestamp, random, sign]
  - match: POST /payments
    guard: idempotency
    required: true
    retention: 24h
  - match: POST /flash-sale/{{sku}}
    rate_limit: {{ algorithm: gcra, rate: 5/s, burst: 5, by: identity }}
"
    )
}

/// One running gateway: killed when dropped (also on an error or a
/// panic of the caller), its file removed.
pub(crate) struct GatewayProcess {
    child: Child,
    /// `http://127.0.0.1:PORT`, as it announced.
    pub(crate) base_url: String,
    file: PathBuf,
}

impl GatewayProcess {
    /// Writes `yaml` to a file of its own and starts `bin` on it,
    /// listening on a free loopback port; returns once it has printed its
    /// `listening on` line.
    ///
    /// # Errors
    /// When the file cannot be written, the binary cannot be started, or it
    /// exits (or stays silent for 30 s) before listening: with what it said
    /// on stderr.
    pub(crate) async fn start(bin: &Path, yaml: &str) -> Result<Self, String> {
        let file = std::env::temp_dir().join(format!(
            "norepeat-gateway-{}-{:016x}.yaml",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::write(&file, yaml).map_err(|e| format!("{}: {e}", file.display()))?;
        // From here on, dropping `process` removes the file and kills the child.
        let mut cmd = Command::new(bin);
        cmd.arg("--config")
            .arg(&file)
            .args(["--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_file(&file);
                return Err(format!("cannot start {}: {e}", bin.display()));
            }
        };
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let mut process = Self {
            child,
            base_url: String::new(),
            file,
        };
        let said = Arc::new(Mutex::new(Vec::<String>::new()));
        if let Some(err) = stderr {
            let said = Arc::clone(&said);
            tokio::spawn(async move {
                let mut lines = BufReader::new(err).lines();
                while let Ok(Some(l)) = lines.next_line().await {
                    if let Ok(mut s) = said.lock() {
                        if s.len() == KEPT_LINES {
                            s.remove(0);
                        }
                        s.push(l);
                    }
                }
            });
        }
        let Some(out) = stdout else {
            return Err("the gateway's stdout is not piped".into());
        };
        let mut lines = BufReader::new(out).lines();
        let announced = tokio::time::timeout(START_DEADLINE, async {
            while let Ok(Some(l)) = lines.next_line().await {
                if let Some(url) = l.trim().strip_prefix("listening on ") {
                    return Some(url.trim_end_matches('/').to_owned());
                }
            }
            None
        })
        .await;
        match announced {
            Ok(Some(url)) => {
                process.base_url = url;
                // Keep reading, so a gateway that prints more never blocks.
                tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                Ok(process)
            }
            failed => {
                let why = if failed.is_err() {
                    "did not say `listening on` within 30 s"
                } else {
                    "exited before listening"
                };
                let _ = process.child.start_kill();
                let _ = process.child.wait().await;
                let said = said.lock().map(|s| s.join("\n")).unwrap_or_default();
                Err(format!(
                    "gateway {} on {}: {why}:\n{said}",
                    bin.display(),
                    process.file.display()
                ))
            }
        }
    }

    /// The process id, while it runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Kills the gateway and waits for it to be gone.
    pub(crate) async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        // `kill_on_drop` kills the child (and tokio reaps it).
        let _ = std::fs::remove_file(&self.file);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_storm_file_guards_each_order_route_by_what_its_clients_send() {
        let f = storm_file("http://127.0.0.1:1", "redis://127.0.0.1:2", "s");
        for (route, guard) in [
            ("POST /orders\n", "guard: token"),
            ("POST /orders/quick\n", "guard: fingerprint"),
            ("POST /payments\n", "guard: idempotency"),
        ] {
            let at = f.find(route).unwrap_or_else(|| panic!("{route} in {f}"));
            let next = f[at..].lines().nth(1).unwrap_or_default();
            assert_eq!(next.trim(), guard, "{route}");
        }
        assert!(f.contains("POST /flash-sale/{sku}"), "{f}");
    }

    #[test]
    fn a_missing_binary_names_both_places() {
        let exe = Path::new("/nonexistent-norepeat-dir/norepeat");
        let e = locate(None, Some(exe)).unwrap_err();
        assert!(e.contains(BIN_ENV), "{e}");
        assert!(
            e.contains("/nonexistent-norepeat-dir/norepeat-gateway"),
            "{e}"
        );
        let e = locate(Some("/nonexistent-gw".into()), Some(exe)).unwrap_err();
        assert!(e.contains("/nonexistent-gw not found"), "{e}");
    }

    #[test]
    fn the_variable_wins_over_the_sibling() {
        // Any existing file will do as "the binary" here.
        let exe = std::env::current_exe().unwrap();
        let found = locate(Some(exe.clone().into_os_string()), Some(Path::new("/x/y"))).unwrap();
        assert_eq!(found, exe);
    }
}
