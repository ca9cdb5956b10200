//! CORS for the API (issue 54): `cors` applies to every route and to the
//! gateway's own answers, with preflights the gateway answers; a page of
//! a listed origin can `POST /payments` with an `Idempotency-Key`, and
//! read the replay's headers; another origin gets none of it.

use crate::common::*;

const SHOP: &str = "https://shop.example";

fn yaml(b: &Process) -> String {
    let routes = "
  - match: POST /payments
    guard: idempotency
    retention: 1m
  - match: POST /flash-sale/{sku}
    rate_limit: { rate: 1/m, burst: 1 }
  - match: POST /down
    guard: fingerprint
    upstream: http://127.0.0.1:9
";
    format!(
        "cors: {{ allow_origins: [{SHOP}] }}\n{}",
        file(b, "memory", routes)
    )
}

/// `name`'s values, every line of it.
fn all(res: &Response, name: &str) -> Vec<String> {
    res.headers()
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

/// The headers a listed origin's answer carries, once each.
fn assert_cors(res: &Response, what: &str) {
    assert_eq!(
        all(res, "access-control-allow-origin"),
        [SHOP],
        "{what}: {res:?}"
    );
    assert_eq!(
        all(res, "access-control-allow-credentials"),
        ["true"],
        "{what}"
    );
    let exposed = all(res, "access-control-expose-headers");
    assert_eq!(exposed.len(), 1, "{what}: {exposed:?}");
    for name in ["Idempotent-Replayed", "Retry-After", "X-Request-Id"] {
        assert!(exposed[0].contains(name), "{what}: {exposed:?}");
    }
    assert_eq!(all(res, "vary"), ["Origin"], "{what}");
}

fn assert_no_cors(res: &Response, what: &str) {
    for name in [
        "access-control-allow-origin",
        "access-control-allow-credentials",
        "access-control-expose-headers",
    ] {
        assert!(!res.headers().contains_key(name), "{what}: {name}");
    }
}

#[tokio::test]
async fn a_listed_page_posts_a_payment_and_reads_its_replay_and_its_refusals() {
    let b = backend(0).await;
    let g = gateway(&yaml(&b)).await;
    let c = Client::new();

    // The preflight: the gateway's, the backend never asked (it answers
    // OPTIONS 501).
    let preflight = c
        .request(reqwest::Method::OPTIONS, url(&g, "/payments"))
        .header("origin", SHOP)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "content-type, idempotency-key, x-user-id",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(preflight.status(), StatusCode::NO_CONTENT);
    assert_eq!(all(&preflight, "access-control-allow-origin"), [SHOP]);
    assert_eq!(all(&preflight, "access-control-allow-methods"), ["POST"]);
    assert_eq!(
        all(&preflight, "access-control-allow-headers"),
        ["content-type, idempotency-key, x-user-id"]
    );
    assert_eq!(
        all(&preflight, "access-control-allow-credentials"),
        ["true"]
    );

    let pay = |key: &'static str, amount: u32| {
        c.post(url(&g, "/payments"))
            .header("origin", SHOP)
            .header("x-user-id", "u1")
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(format!(r#"{{"amount":{amount}}}"#))
            .send()
    };
    let first = pay("k1", 5).await.unwrap();
    assert_eq!(first.status(), 201);
    assert_cors(&first, "the backend's answer");
    let replay = pay("k1", 5).await.unwrap();
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_cors(&replay, "the replay");
    let mismatch = pay("k1", 6).await.unwrap();
    assert_eq!(mismatch.status(), 422);
    assert_cors(&mismatch, "the gateway's 422");
    assert_eq!(effects(&b).await["/payments"], 1);

    // A 429 (its Retry-After readable) and a 502 of the gateway's.
    let sale = || {
        c.post(url(&g, "/flash-sale/a1"))
            .header("origin", SHOP)
            .header("x-user-id", "u1")
            .send()
    };
    assert_eq!(sale().await.unwrap().status(), 201);
    let limited = sale().await.unwrap();
    assert_eq!(limited.status(), 429);
    assert!(limited.headers().contains_key("retry-after"));
    assert_cors(&limited, "the gateway's 429");
    let down = c
        .post(url(&g, "/down"))
        .header("origin", SHOP)
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(down.status(), 502);
    assert_cors(&down, "the gateway's 502");
}

#[tokio::test]
async fn another_origin_gets_no_cors_headers_and_its_preflight_is_the_backends() {
    let b = backend(0).await;
    let g = gateway(&yaml(&b)).await;
    let c = Client::new();
    let evil = "https://shop.example.evil";
    let preflight = c
        .request(reqwest::Method::OPTIONS, url(&g, "/payments"))
        .header("origin", evil)
        .header("access-control-request-method", "POST")
        .send()
        .await
        .unwrap();
    // Python's http.server has no OPTIONS: the backend answered.
    assert_eq!(preflight.status(), StatusCode::NOT_IMPLEMENTED);
    assert_no_cors(&preflight, "another origin's preflight");
    let pay = |amount: u32| {
        c.post(url(&g, "/payments"))
            .header("origin", evil)
            .header("x-user-id", "u1")
            .header("idempotency-key", "e1")
            .body(format!(r#"{{"amount":{amount}}}"#))
            .send()
    };
    let first = pay(1).await.unwrap();
    assert_eq!(first.status(), 201);
    assert_no_cors(&first, "the backend's answer");
    assert_eq!(all(&first, "vary"), ["Origin"]);
    let mismatch = pay(2).await.unwrap();
    assert_eq!(mismatch.status(), 422);
    assert_no_cors(&mismatch, "the gateway's 422");
    // A request without an Origin (a server, curl) is left as it was.
    let plain = c
        .post(url(&g, "/payments"))
        .header("x-user-id", "u1")
        .header("idempotency-key", "p1")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), 201);
    assert_no_cors(&plain, "no Origin");
    assert!(!plain.headers().contains_key("vary"));
}

/// A backend that speaks CORS itself (`*`, its own exposed header, its own
/// `Vary`): a listed origin gets one `Access-Control-Allow-Origin`, the
/// gateway's; the backend's exposed header stays; nothing is sent twice.
/// Another origin gets the backend's headers as they were.
const CORS_BACKEND: &str = r#"
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"ok":true}'
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("Access-Control-Expose-Headers", "X-Order")
        self.send_header("Vary", "Origin")
        self.send_header("X-Order", "7")
        self.end_headers()
        self.wfile.write(body)

server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
server.serve_forever()
"#;

#[tokio::test]
async fn a_backends_own_cors_headers_are_never_sent_twice() {
    let b = Process::start("python3", vec!["-c".into(), CORS_BACKEND.into()]).await;
    let g = gateway(&yaml(&b)).await;
    let c = Client::new();
    let pay = |origin: &'static str, key: &'static str| {
        c.post(url(&g, "/payments"))
            .header("origin", origin)
            .header("x-user-id", "u1")
            .header("idempotency-key", key)
            .body("{}")
            .send()
    };
    for (key, what) in [("b1", "the answer"), ("b1", "its replay")] {
        let res = pay(SHOP, key).await.unwrap();
        assert_eq!(res.status(), 201, "{what}");
        assert_cors(&res, what);
        let exposed = &all(&res, "access-control-expose-headers")[0];
        assert!(exposed.starts_with("X-Order, "), "{what}: {exposed}");
    }
    let other = pay("https://other.example", "b2").await.unwrap();
    assert_eq!(all(&other, "access-control-allow-origin"), ["*"]);
    assert_eq!(all(&other, "access-control-expose-headers"), ["X-Order"]);
    assert!(
        !other
            .headers()
            .contains_key("access-control-allow-credentials")
    );
    assert_eq!(all(&other, "vary"), ["Origin"]);
}

/// The same in Chromium (`tests/browser/gateway_cors.test.mjs`): a page of
/// a listed origin posts a payment with its key across origins (the
/// browser's own preflight first), reads the replay's header and the
/// gateway's 422; a page of another origin reads nothing. Needs what the
/// browser test of `browser.rs` needs; without it this test fails, it is
/// never skipped.
#[tokio::test]
async fn a_listed_page_pays_across_origins_in_a_real_browser() {
    let b = backend(0).await;
    let other = backend(0).await;
    let routes = "
  - match: POST /payments
    guard: idempotency
    retention: 1m
";
    let yaml = format!(
        "cors: {{ allow_origins: [\"http://127.0.0.1:{}\"] }}\n{}",
        b.port,
        file(&b, "memory", routes)
    );
    let g = gateway(&yaml).await;
    let urls = [url(&g, ""), url(&b, ""), url(&other, "")];
    crate::browser::run_browser_script("gateway_cors.test.mjs", &urls).await;
    assert_eq!(effects(&b).await["/payments"], 1);
}

/// The gateway's own refusal on a path no route takes (its upstream down:
/// 502) carries the CORS headers for a listed origin whichever way the
/// request came in: a `GET` without a body over a cleartext keep-alive
/// connection is forwarded by the lane, which writes its own 502 (and
/// wrote it without them); one with a body is `dispatch`'s. Without them
/// a page of the listed origin could not read why its fetch failed.
#[tokio::test]
async fn a_refusal_on_a_path_no_route_takes_carries_the_cors_headers() {
    let yaml = format!(
        "cors: {{ allow_origins: [{SHOP}] }}\nupstream: http://127.0.0.1:{}\nstore: memory\n",
        free_port()
    );
    let g = gateway(&yaml).await;
    let client = Client::new();
    for (method, body) in [("GET", ""), ("DELETE", ""), ("POST", "{}")] {
        let res = client
            .request(method.parse().unwrap(), url(&g, "/api/cart"))
            .header("origin", SHOP)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::BAD_GATEWAY, "{method}");
        assert_cors(&res, method);
        assert_eq!(
            code(res).await,
            (StatusCode::BAD_GATEWAY, "upstream_unavailable".into())
        );
    }
    // Another origin: told apart, never allowed.
    let res = client
        .get(url(&g, "/api/cart"))
        .header("origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
    assert_no_cors(&res, "another origin");
    assert_eq!(all(&res, "vary"), ["Origin"]);
}
