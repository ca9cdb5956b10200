//! No request, however malformed, gets a 5xx from the gateway other than
//! 502 (here: nothing listens upstream), 503 `guard_unavailable` or 504,
//! and none panics it: random methods, paths, headers and bodies against
//! every kind of route, in process.

// Test helpers outside #[test] functions unwrap too: a failure there is a failed test.

use axum::body::Body;
use norepeat_gateway::config::Config;
use norepeat_gateway::serve::Gateway;
use proptest::prelude::*;
use std::sync::OnceLock;
use tower::ServiceExt;

const FILE: &[u8] = b"
upstream: http://127.0.0.1:9
identity: { header: Authorization }
routes:
  - match: POST /orders
    guard: token
  - match: POST /orders/{id}
    guard: fingerprint
    max_request_body: 1KiB
  - match: PUT /payments/{id}
    guard: idempotency
    required: true
  - match: POST /pay
    guard: idempotency
    required: false
    shadow: true
  - match: DELETE /flash/{sku}
    rate_limit: { rate: 2/s, by: address }
";

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Runtime::new().unwrap())
}

fn app() -> axum::Router {
    static APP: OnceLock<axum::Router> = OnceLock::new();
    APP.get_or_init(|| {
        let config = Config::parse("g.yaml", FILE).unwrap();
        runtime()
            .block_on(Gateway::build(&config, None))
            .unwrap()
            .into_router()
    })
    .clone()
}

fn method() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS",
    ])
}

fn path() -> impl Strategy<Value = String> {
    let segment = prop::sample::select(vec![
        "orders", "payments", "pay", "flash", "x", "%2F", "..", "", "{id}", "%00", "a b",
    ]);
    prop::collection::vec(segment, 0..4).prop_map(|s| format!("/{}", s.join("/")))
}

fn headers() -> impl Strategy<Value = Vec<(&'static str, Vec<u8>)>> {
    let name = prop::sample::select(vec![
        "authorization",
        "idempotency-key",
        "repeat-token",
        "content-type",
        "content-length",
        "x-forwarded-for",
        "connection",
        "transfer-encoding",
    ]);
    prop::collection::vec((name, prop::collection::vec(0x20u8..0x7f, 0..40)), 0..5)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    #[test]
    fn no_request_gets_an_unexpected_5xx(
        method in method(),
        path in path(),
        headers in headers(),
        body in prop::collection::vec(any::<u8>(), 0..2048),
    ) {
        let mut req = http::Request::builder().method(method);
        req = match path.parse::<http::Uri>() {
            Ok(uri) => req.uri(uri),
            Err(_) => req.uri("/"),
        };
        for (name, value) in &headers {
            if let Ok(v) = http::HeaderValue::from_bytes(value) {
                req = req.header(*name, v);
            }
        }
        let Ok(req) = req.body(Body::from(body)) else { return Ok(()) };
        let status = send(req);
        prop_assert!(
            !status.is_server_error() || [502, 503, 504].contains(&status.as_u16()),
            "{method} {path} {headers:?}: {status}"
        );
    }
}

/// Sends `req` as from a peer at 192.0.2.1 (what axum's `ConnectInfo`
/// gives a served request), with a `Host` as every HTTP/1.1 client sends
/// (one without it is 400, RFC 9112 §3.2).
fn send(mut req: http::Request<Body>) -> http::StatusCode {
    let peer: std::net::SocketAddr = "192.0.2.1:4000".parse().unwrap();
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(peer));
    req.headers_mut()
        .entry(http::header::HOST)
        .or_insert(http::HeaderValue::from_static("gateway.test"));
    runtime().block_on(app().oneshot(req)).unwrap().status()
}

/// The routes above are reached (not every request is a 502): the guards
/// answer before the closed upstream would.
#[test]
fn the_guards_answer_before_the_upstream() {
    let no_key = http::Request::put("/payments/1")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(no_key), 400, "missing_idempotency_key");
    let no_token = http::Request::post("/orders").body(Body::empty()).unwrap();
    assert_eq!(send(no_token), 400, "missing_token");
    let too_big = http::Request::post("/orders/1")
        .body(Body::from(vec![b'x'; 4096]))
        .unwrap();
    assert_eq!(send(too_big), 413, "payload_too_large");
    let unguarded = http::Request::get("/anything").body(Body::empty()).unwrap();
    assert_eq!(send(unguarded), 502);
}
