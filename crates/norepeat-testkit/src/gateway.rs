//! A `norepeat-gateway` process on a file written for it: found next to
//! the running executable (or at `NOREPEAT_GATEWAY_BIN`), started on a free
//! loopback port, killed when dropped. The shop's `storm` (its `gateway`
//! defence) and the bench's `gateway.*` rows start theirs with it.
//!
//! Unlike the rest of this crate its functions return errors rather than
//! panic: the storm and the bench are commands, and a missing gateway
//! leaves their gateway rows out with a note.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The environment variable naming the gateway binary.
pub const GATEWAY_BIN_ENV: &str = "NOREPEAT_GATEWAY_BIN";

/// How long a gateway may take to print its `listening on` line.
const START_DEADLINE: Duration = Duration::from_secs(30);

/// Lines of a gateway's stderr kept to explain a failed start.
const KEPT_LINES: usize = 20;

/// The gateway binary: [`GATEWAY_BIN_ENV`], else `norepeat-gateway`
/// next to this executable.
///
/// # Errors
/// When the binary is not there, naming both places.
///
/// ```no_run
/// let bin = norepeat_testkit::gateway_binary().expect("built beside this executable");
/// assert!(bin.ends_with("norepeat-gateway"));
/// ```
pub fn gateway_binary() -> Result<PathBuf, String> {
    locate(
        std::env::var_os(GATEWAY_BIN_ENV),
        std::env::current_exe().ok().as_deref(),
    )
}

/// [`gateway_binary`] for a given `NOREPEAT_GATEWAY_BIN` value and executable.
fn locate(env: Option<std::ffi::OsString>, exe: Option<&Path>) -> Result<PathBuf, String> {
    let sibling = exe.and_then(|exe| exe.parent().map(|d| d.join("norepeat-gateway")));
    let named = env.filter(|v| !v.is_empty()).map(PathBuf::from);
    match named.as_ref().or(sibling.as_ref()) {
        Some(p) if p.is_file() => Ok(p.clone()),
        _ => Err(format!(
            "the gateway binary is missing: looked for {GATEWAY_BIN_ENV} ({}) and for {} (build it with `cargo build -p norepeat-gateway`)",
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

/// One running gateway: killed when dropped (also on an error or a
/// panic of the caller), its file removed.
///
/// ```no_run
/// use norepeat_testkit::{GatewayProcess, gateway_binary};
///
/// # async fn demo() -> Result<(), String> {
/// let bin = gateway_binary()?;
/// let file = "upstream: http://127.0.0.1:9000\nstore: memory\nroutes: []\n";
/// let gateway = GatewayProcess::start(&bin, file).await?;
/// println!("through {}", gateway.base_url);
/// gateway.stop().await;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct GatewayProcess {
    child: Child,
    /// `http://127.0.0.1:PORT`, as it announced.
    pub base_url: String,
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
    pub async fn start(bin: &Path, yaml: &str) -> Result<Self, String> {
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
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Kills the gateway and waits for it to be gone.
    pub async fn stop(mut self) {
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
    fn a_missing_binary_names_both_places() {
        let exe = Path::new("/nonexistent-norepeat-dir/norepeat");
        let e = locate(None, Some(exe)).unwrap_err();
        assert!(e.contains(GATEWAY_BIN_ENV), "{e}");
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
