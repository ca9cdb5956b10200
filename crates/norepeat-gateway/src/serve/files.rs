//! Files the gateway reads again while it runs (its YAML file, the TLS
//! certificate and key): read only once they have stopped changing, so a
//! file being written is never read half-way.

use std::path::Path;
use std::time::Duration;

/// What a file looks like from outside: its modification time and length
/// (`None`: not there).
pub(crate) fn stat(path: &Path) -> Option<(Option<std::time::SystemTime>, u64)> {
    std::fs::metadata(path)
        .ok()
        .map(|m| (m.modified().ok(), m.len()))
}

/// How long a file must stay unchanged before it is read.
pub(crate) const SETTLED: Duration = Duration::from_millis(300);

/// Waits until `path` looks the same twice, [`SETTLED`] apart (for at most
/// 5 s: a file rewritten without end is read as it is then); what it
/// looked like last.
pub(crate) async fn settled<T: PartialEq>(
    path: &Path,
    mut last: T,
    stat: impl Fn(&Path) -> T,
) -> T {
    for _ in 0..(5_000 / SETTLED.as_millis()) {
        tokio::time::sleep(SETTLED).await;
        let now = stat(path);
        if now == last {
            return now;
        }
        last = now;
    }
    last
}
