//! Two gateways on the master three Sentinels name (`store:
//! redis+sentinel://...?replicas=1`), in front of the order service of
//! `tests/backend.py`, which counts one effect per request it runs. The
//! master is killed with SIGKILL while payments go on through both, each
//! retried on the other gateway until it is answered: no payment runs
//! twice, and the gateways decide on the new master without a restart.

use crate::common::{StatusCode, backend, effects, file_for, gateway, pay_on};
use norepeat_testkit::RedisSentinels;
use std::time::{Duration, Instant};

const ROUTES: &str = "
  - match: POST /payments
    guard: idempotency
    retention: 5m
    timeout: 2s
";

/// Sends payment `key` through the gateways in turn, starting with
/// `first`, until one answers other than 503 (the store failed, so the
/// backend was not called) or 409 (a try whose outcome is unknown holds
/// the key); its status.
async fn pay_until_answered(
    gateways: &[&crate::common::Process],
    first: usize,
    key: &str,
) -> StatusCode {
    let began = Instant::now();
    for attempt in 0.. {
        let answer = pay_on(gateways[(first + attempt) % 2], "/payments", key).await;
        let status = answer.status();
        if status != StatusCode::SERVICE_UNAVAILABLE && status != StatusCode::CONFLICT {
            return status;
        }
        if began.elapsed() >= Duration::from_secs(90) {
            let body = answer.text().await.unwrap_or_default();
            panic!("{key}: still {status} after 90 s: {body}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    unreachable!()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_run_no_payment_twice_across_a_failover() {
    let mut group = RedisSentinels::start().await;
    let backend = backend(0).await;
    let store = format!("{}?replicas=1&replicas_timeout=500ms", group.url());
    let (g1, g2) = (
        gateway(&file_for(backend.port, &store, ROUTES)).await,
        gateway(&file_for(backend.port, &store, ROUTES)).await,
    );
    let gateways = [&g1, &g2];
    let mut paid = Vec::new();
    for n in 0..20 {
        let key = format!("before-{n}");
        assert!(pay_until_answered(&gateways, n, &key).await.is_success());
        paid.push(key);
    }

    let old = group.kill_master().await;
    // Payments go on, each retried across the gateways, until the
    // Sentinels promoted a replica and the gateways followed.
    let killed = Instant::now();
    let mut n = 0;
    let new = loop {
        let key = format!("during-{n}");
        assert!(pay_until_answered(&gateways, n, &key).await.is_success());
        paid.push(key);
        n += 1;
        if n >= 5 && killed.elapsed() > Duration::from_secs(3) {
            break group.wait_for_failover(old).await;
        }
    };
    assert_ne!(new, old);
    for n in 0..20 {
        let key = format!("after-{n}");
        assert!(pay_until_answered(&gateways, n, &key).await.is_success());
        paid.push(key);
    }

    // Every payment again, through the other gateway: each a replay.
    for (n, key) in paid.iter().enumerate() {
        let again = pay_until_answered(&gateways, n + 1, key).await;
        assert!(again.is_success(), "{key}: {again}");
    }
    let ran = effects(&backend).await["/payments"].as_u64().unwrap_or(0);
    assert_eq!(
        ran,
        paid.len() as u64,
        "each of {} payments ran once",
        paid.len()
    );
}
