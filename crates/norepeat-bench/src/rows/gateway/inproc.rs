//! The `gateway.inproc.*` rows' driver: `POST /orders` from this process,
//! as the `http.*` rows drive their server (the earlier measure, kept to
//! compare).

use super::super::super::error::BenchError;
use super::super::super::harness::{Load, Sample, measure};
use super::ANSWER;
use std::sync::Arc;
use std::time::Duration;

/// Drives `POST {base}/orders` as the `http.*` rows do.
pub(super) async fn drive(
    name: &'static str,
    base: &str,
    load: &Load,
    run: u64,
) -> Result<Sample, BenchError> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(load.concurrency)
        .build()?;
    let url: Arc<str> = Arc::from(format!("{base}/orders"));
    let tag = name.len();
    measure(load, move |id| {
        let client = client.clone();
        let url = Arc::clone(&url);
        let body = format!(r#"{{"sku":"SKU-1","quantity":1,"note":"{run:016x}{tag}-{id}"}}"#);
        async move {
            let res = client
                .post(&*url)
                .header("x-user-id", "bench-user")
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await?;
            let status = res.status();
            let bytes = res.bytes().await?;
            if status != reqwest::StatusCode::CREATED || bytes != ANSWER.as_bytes() {
                return Err(BenchError::unexpected(
                    name,
                    format!("answered {status}: {}", String::from_utf8_lossy(&bytes)),
                ));
            }
            Ok(())
        }
    })
    .await
}

/// The proxy's CPU time per request, on stderr (warm-up included).
pub(super) fn note_cpu(name: &str, cpu: Option<Duration>, sample: &Result<Sample, BenchError>) {
    if let (Some(cpu), Ok(s)) = (cpu, sample) {
        // The warm-up ran at about the measured rate.
        #[allow(clippy::cast_precision_loss)]
        let requests = s.ops as f64 * 1.2;
        eprintln!(
            "bench: {name}: the proxy process used {:.1} µs of CPU per request",
            cpu.as_secs_f64() * 1e6 / requests.max(1.0)
        );
    }
}
