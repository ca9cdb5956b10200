//! A refusal a browser can show (issue 54): a refusal of the gateway or
//! its guards to a browser's navigation (`Accept` prefers `text/html`) is
//! a small HTML page with the same status and headers, or the operator's
//! `error_page`; JSON clients and `Accept: */*` keep problem+json.

use crate::common::*;

/// What Chromium sends with a navigation (a form's POST).
const NAVIGATION: &str = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,image/apng,*/*;q=0.8,application/signed-exchange;v=b3;q=0.7";

const ROUTES: &str = "
  - match: POST /orders/quick
    guard: fingerprint
    window: 1m
  - match: POST /flash-sale/{sku}
    rate_limit: { rate: 1/m, burst: 1 }
";

async fn order(g: &Process, accept: Option<&str>, referer: Option<&str>) -> Response {
    let mut req = Client::new()
        .post(url(g, "/orders/quick"))
        .header("x-user-id", "u1")
        .header("content-type", "application/json")
        .body(r#"{"sku":"a1"}"#);
    if let Some(a) = accept {
        req = req.header("accept", a);
    }
    if let Some(r) = referer {
        req = req.header("referer", r);
    }
    req.send().await.unwrap()
}

#[tokio::test]
async fn a_browser_gets_a_page_with_the_status_and_retry_after_and_an_api_client_json() {
    let b = backend(0).await;
    let g = gateway(&file(&b, "memory", ROUTES)).await;
    assert_eq!(order(&g, Some(NAVIGATION), None).await.status(), 201);

    // The duplicate, to a browser's navigation from the shop's own form.
    let form = url(&g, "/form?step=2");
    let page = order(&g, Some(NAVIGATION), Some(&form)).await;
    assert_eq!(page.status(), StatusCode::CONFLICT);
    assert_eq!(page.headers()["content-type"], "text/html; charset=utf-8");
    assert!(page.headers().contains_key("retry-after"));
    assert!(page.headers().contains_key("x-request-id"));
    let html = page.text().await.unwrap();
    assert!(html.starts_with("<!doctype html>"), "{html}");
    assert!(
        html.contains("<title>409 Duplicate submission</title>"),
        "{html}"
    );
    assert!(html.contains("<h1>Duplicate submission</h1>"), "{html}");
    assert!(html.contains(&format!(r#"<a href="{form}">"#)), "{html}");

    // From another site's page: the link goes to the root, never there.
    let page = order(&g, Some(NAVIGATION), Some("https://evil.example/x")).await;
    let html = page.text().await.unwrap();
    assert!(html.contains(r#"<a href="/">"#), "{html}");
    assert!(!html.contains("evil.example"), "{html}");

    // An API client, `*/*`, or no Accept: problem+json as ever.
    for accept in [Some("application/json"), Some("*/*"), None] {
        let res = order(&g, accept, None).await;
        assert_eq!(
            res.headers()["content-type"],
            "application/problem+json",
            "{accept:?}"
        );
        assert!(res.headers().contains_key("retry-after"));
        assert_eq!(
            code(res).await,
            (StatusCode::CONFLICT, "duplicate_submission".into())
        );
    }

    // A 429 keeps its status and Retry-After on its page.
    let sale = || {
        Client::new()
            .post(url(&g, "/flash-sale/a1"))
            .header("x-user-id", "u1")
            .header("accept", NAVIGATION)
            .send()
    };
    assert_eq!(sale().await.unwrap().status(), 201);
    let limited = sale().await.unwrap();
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(limited.headers().contains_key("retry-after"));
    assert!(limited.headers().contains_key("ratelimit"));
    assert!(limited.text().await.unwrap().contains("Too many requests"));

    // The gateway's own 400, whose detail holds a quote: escaped.
    let (status, text) = raw(
        &g,
        "POST /Orders/quick",
        &[("accept", NAVIGATION), ("x-user-id", "u1")],
        "{}",
    )
    .await;
    assert_eq!(status, 400);
    assert!(text.contains("text/html; charset=utf-8"), "{text}");
    assert!(
        text.contains("guarded route&#39;s in another case"),
        "{text}"
    );
    assert_eq!(effects(&b).await["/orders/quick"], 1);
}

#[tokio::test]
async fn the_operators_error_page_is_filled_escaped_and_read_again_on_reload() {
    let b = backend(0).await;
    let page = temp_file(
        "html",
        b"<html><title>{status}</title><p class=\"why\">{detail}</p><a href=\"{back}\">back</a> {code}</html>",
    );
    let yaml = format!(
        "error_page: {}\n{}",
        page.display(),
        file(&b, "memory", ROUTES)
    );
    let g = gateway(&yaml).await;
    let (status, text) = raw(
        &g,
        "POST /Orders/quick",
        &[("accept", NAVIGATION), ("x-user-id", "u1")],
        "{}",
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        text.contains("<html><title>400</title><p class=\"why\">The path is a guarded route&#39;s"),
        "{text}"
    );
    assert!(
        text.contains("<a href=\"/\">back</a> invalid_request</html>"),
        "{text}"
    );

    // A new page, read on the reload (SIGHUP).
    std::fs::write(&page, b"<p>sorry: {title}</p>").unwrap();
    g.signal("-HUP").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let res = order(&g, Some(NAVIGATION), None).await;
        let body = res.text().await.unwrap();
        if body == "<p>sorry: Duplicate submission</p>" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never reloaded: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A page gone: the reload fails and the page read before stays.
    std::fs::remove_file(&page).unwrap();
    g.signal("-HUP").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while health(&g).await["last_reload"]["result"] != "failed" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the reload never failed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let res = order(&g, Some(NAVIGATION), None).await;
    assert_eq!(
        res.text().await.unwrap(),
        "<p>sorry: Duplicate submission</p>"
    );
}

/// A missing page is a problem of `check`, as of the start.
#[test]
fn a_missing_error_page_fails_check() {
    let file = temp_file(
        "yaml",
        b"upstream: http://127.0.0.1:9\nerror_page: /nonexistent/refused.html\n",
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_norepeat-gateway"))
        .arg("check")
        .arg(&file)
        .env_clear()
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(":2:13: error_page: cannot read /nonexistent/refused.html"),
        "{err}"
    );
}

/// A browser's navigation to a page no route takes, while the backend is
/// down, gets the gateway's 502 as a page, as a route's refusal does: a
/// `GET` without a body over a cleartext keep-alive connection is
/// forwarded by the lane, which writes its own 502 (and wrote it as
/// problem+json); a `POST` with a body is `dispatch`'s. An API client
/// keeps problem+json.
#[tokio::test]
async fn a_navigation_to_a_page_no_route_takes_gets_the_page_when_the_backend_is_down() {
    let yaml = format!(
        "upstream: http://127.0.0.1:{}\nstore: memory\n",
        free_port()
    );
    let g = gateway(&yaml).await;
    let client = Client::new();
    for (method, body) in [("GET", ""), ("POST", "sku=a1")] {
        let res = client
            .request(method.parse().unwrap(), url(&g, "/shop/cart"))
            .header("accept", NAVIGATION)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::BAD_GATEWAY, "{method}");
        assert_eq!(
            res.headers()["content-type"],
            "text/html; charset=utf-8",
            "{method}"
        );
        assert!(res.headers().contains_key("x-request-id"), "{method}");
        let html = res.text().await.unwrap();
        assert!(
            html.contains("<title>502 Upstream unavailable</title>"),
            "{method}: {html}"
        );
    }
    // The link back to the page it came from, as on a route's refusal.
    let form = url(&g, "/shop?step=2");
    let res = client
        .get(url(&g, "/shop/cart"))
        .header("accept", NAVIGATION)
        .header("referer", &form)
        .send()
        .await
        .unwrap();
    let html = res.text().await.unwrap();
    assert!(html.contains(&format!(r#"<a href="{form}">"#)), "{html}");
    for accept in [Some("application/json"), Some("*/*"), None] {
        let mut req = client.get(url(&g, "/shop/cart"));
        if let Some(a) = accept {
            req = req.header("accept", a);
        }
        let res = req.send().await.unwrap();
        assert_eq!(
            res.headers()["content-type"],
            "application/problem+json",
            "{accept:?}"
        );
        assert_eq!(
            code(res).await,
            (StatusCode::BAD_GATEWAY, "upstream_unavailable".into())
        );
    }
}
