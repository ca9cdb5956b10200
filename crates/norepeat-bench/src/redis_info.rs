//! What a Redis server says of itself (`INFO`), and whether it runs on
//! this machine: read by the memory probe (`probe.rs`) and by the gateway
//! rows, for the server's CPU time.

use super::error::BenchError;
use redis::aio::MultiplexedConnection;

/// The process id of the Redis server at `url` when it runs on this
/// machine: its `INFO server` `process_id`, whose `/proc` entry is a
/// `redis-server`'s (a server in a container of its own, or on another
/// machine, has an id that names nothing here, or something else).
/// `None` otherwise: its CPU time cannot be read.
pub(crate) async fn local_server_pid(url: &str) -> Option<u32> {
    let client = redis::Client::open(url).ok()?;
    let mut con = client.get_multiplexed_async_connection().await.ok()?;
    let pid: u32 = info_field(&mut con, "server", "process_id")
        .await
        .ok()?
        .parse()
        .ok()?;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    comm.starts_with("redis-server").then_some(pid)
}

/// `INFO section`.
pub(crate) async fn info(
    con: &mut MultiplexedConnection,
    section: &str,
) -> Result<String, BenchError> {
    Ok(redis::cmd("INFO").arg(section).query_async(con).await?)
}

/// A line `name:value` of `INFO section`.
pub(crate) async fn info_field(
    con: &mut MultiplexedConnection,
    section: &str,
    name: &str,
) -> Result<String, BenchError> {
    info(con, section)
        .await?
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
        .ok_or_else(|| BenchError::Probe(format!("INFO {section} has no {name}")))
}
