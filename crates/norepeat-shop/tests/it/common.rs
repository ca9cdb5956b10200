//! What the shop's integration tests share (tower-sessions' `tests/common`):
//! the binary's path, the shop's router on a SQLite file, and one answer
//! type read the same way from the router and from a shop process.
//!
//! Each test module that needs it says `use crate::common;`; not every
//! module uses every helper, hence `dead_code` is allowed here.

#![allow(dead_code)]

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use bytes::Bytes;
use norepeat::store::{AnyStore, MemoryStore};
use norepeat_shop::app::AppState;
use norepeat_shop::config::ShopConfig;
use norepeat_shop::db::Db;
use norepeat_shop::events::Events;
use norepeat_shop::routes::app;
use norepeat_testkit::SqliteFile;
use serde_json::Value;

/// The `norepeat` binary cargo built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_norepeat");

/// The shop binary as a command started from a cleared environment: only
/// [`KEPT_ENV`](norepeat_testkit::KEPT_ENV) of the test's, as
/// [`ShopProcess`](norepeat_testkit::ShopProcess) does, so a `DATABASE_URL`,
/// `REDIS_URL` or `NOREPEAT_*` of whoever runs the tests never changes what a
/// test runs.
pub fn shop_command() -> std::process::Command {
    let mut cmd = std::process::Command::new(BIN);
    cmd.env_clear()
        .envs(kept_env())
        .stdin(std::process::Stdio::null());
    cmd
}

/// [`shop_command`] for tokio.
pub fn shop_command_async() -> tokio::process::Command {
    tokio::process::Command::from(shop_command())
}

fn kept_env() -> impl Iterator<Item = (&'static str, String)> {
    norepeat_testkit::KEPT_ENV
        .into_iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k, v)))
}

/// The value of the Prometheus sample `name` whose labels include every
/// pair of `labels` (in any order), or 0 when there is none yet.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, "}"));
            let has_all = labels
                .iter()
                .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
            (n == name && has_all).then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

/// The sum of the series `name` with `labels` in the shop at `base`'s
/// `/metrics` (0 when there is none).
pub async fn scrape(
    http: &reqwest::Client,
    base: &str,
    name: &str,
    labels: &[(&str, &str)],
) -> f64 {
    let text = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    sample(&text, name, labels)
}

/// `GET /healthz` on the shop at `base`: its JSON.
pub async fn healthz(http: &reqwest::Client, base: &str) -> Value {
    http.get(format!("{base}/healthz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// `n` `POST /orders/quick` at once as `user`, the `i`th to
/// `bases[i % bases.len()]` with the body `body(i)`: their statuses, in
/// that order.
pub async fn quick_orders(
    bases: &[String],
    user: &str,
    n: usize,
    body: impl Fn(usize) -> Value,
) -> Vec<u16> {
    let http = reqwest::Client::new();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let send = http
                .post(format!("{}/orders/quick", bases[i % bases.len()]))
                .header("x-user-id", user)
                .json(&body(i))
                .send();
            tokio::spawn(async move { send.await.unwrap().status().as_u16() })
        })
        .collect();
    let mut statuses = Vec::with_capacity(n);
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    statuses
}

/// `PUT /admin/stock/{sku}` on the shop at `base` with admin token
/// `admin`: `available` units, answered 200.
pub async fn set_stock(base: &str, admin: &str, sku: &str, available: u64) {
    let res = reqwest::Client::new()
        .put(format!("{base}/admin/stock/{sku}"))
        .header("x-admin-token", admin)
        .json(&serde_json::json!({ "available": available }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200, "setting the stock of {sku} at {base}");
}

/// `pairs` as a shop process's environment.
pub fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// One answer of the shop: status, headers and the JSON body (`Null` when
/// the body is not JSON).
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
    /// The body as sent (a replay is compared byte for byte).
    pub bytes: Bytes,
}

impl Answer {
    /// The status and the problem's `code` (empty when there is none).
    pub fn code(&self) -> (u16, &str) {
        (
            self.status.as_u16(),
            self.body["code"].as_str().unwrap_or(""),
        )
    }

    /// Whether `Idempotent-Replayed: true` came with it.
    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    /// An answer as it came, unchecked (for a test that expects a 5xx).
    fn unchecked(status: StatusCode, headers: HeaderMap, bytes: Bytes) -> Answer {
        Answer {
            status,
            headers,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            bytes,
        }
    }

    /// An answer of `what` (a request's method and path), checked as the
    /// contract says every answer is: never a 5xx, and every 4xx an RFC
    /// 9457 problem document carrying its own status.
    fn checked(what: &str, status: StatusCode, headers: HeaderMap, bytes: Bytes) -> Answer {
        let answer = Answer::unchecked(status, headers, bytes);
        let Answer { headers, body, .. } = &answer;
        assert!(!status.is_server_error(), "{what}: {status}: {body}");
        if status.is_client_error() {
            assert_eq!(
                headers
                    .get("content-type")
                    .map(|v| v.to_str().unwrap().to_owned())
                    .as_deref(),
                Some("application/problem+json"),
                "{what}: {status}: {}",
                String::from_utf8_lossy(&answer.bytes)
            );
            assert_eq!(body["status"], status.as_u16(), "{what}: {body}");
        }
        answer
    }

    /// Reads and checks the answer of a shop process.
    pub async fn read(what: &str, res: reqwest::Response) -> Answer {
        let status = res.status();
        let headers = res.headers().clone();
        let bytes = res.bytes().await.unwrap();
        Answer::checked(what, status, headers, bytes)
    }

    /// Reads the answer of a shop process as it came (a 5xx included).
    pub async fn read_unchecked(res: reqwest::Response) -> Answer {
        let status = res.status();
        let headers = res.headers().clone();
        Answer::unchecked(status, headers, res.bytes().await.unwrap())
    }
}

/// The shop's router over a SQLite file of its own and the memory store,
/// publishing no events.
pub struct RouterShop {
    pub app: Router,
    _db: SqliteFile,
}

/// The state of a shop configured by `cfg`, on a new SQLite file and the
/// memory store, publishing no events.
pub async fn state(cfg: ShopConfig) -> (AppState, SqliteFile) {
    let file = SqliteFile::new();
    let db = Db::connect(Some(&file.url())).await.unwrap();
    let state = AppState::with(
        db,
        AnyStore::Memory(MemoryStore::default()),
        cfg,
        Events::disabled(),
    )
    .await
    .unwrap();
    (state, file)
}

impl RouterShop {
    /// The router of `state`, keeping its database `file`.
    pub fn new(state: AppState, file: SqliteFile) -> RouterShop {
        RouterShop {
            app: app(state),
            _db: file,
        }
    }

    /// The shop configured by `cfg` (see [`state`]).
    pub async fn with(cfg: ShopConfig) -> RouterShop {
        let (state, file) = state(cfg).await;
        RouterShop::new(state, file)
    }

    /// Sends `req` through the router (the kit's [`norepeat_testkit::send`])
    /// and checks the answer.
    pub async fn send(&self, req: Request<Body>) -> Answer {
        let what = format!("{} {}", req.method(), req.uri());
        let norepeat_testkit::Answer {
            status,
            headers,
            body,
        } = norepeat_testkit::send(&self.app, req).await;
        Answer::checked(&what, status, headers, body)
    }
}
