//! One path, two kinds of client (issue 54): a route may match on the
//! request body's `content_type`, so a form gets the token guard and a
//! JSON client the fingerprint on the same `POST /orders`; a body of any
//! other type goes to the path's route without one, which `check`
//! insists is guarded.

use crate::common::*;

const TYPED: &str = "
  - match: POST /orders
    content_type: application/x-www-form-urlencoded
    guard: token
  - match: POST /orders
    content_type: application/json
    guard: fingerprint
    window: 1m
";

/// The third route: every other body type, guarded too.
const REST: &str = "  - match: POST /orders
    guard: token
";

#[tokio::test]
async fn a_form_and_a_json_client_post_to_one_path_each_under_its_own_guard() {
    let b = backend(0).await;
    let g = gateway(&file(&b, "memory", &format!("{TYPED}{REST}"))).await;
    let c = Client::new();
    let post = |content_type: Option<&'static str>, body: String| {
        let mut req = c
            .post(url(&g, "/orders"))
            .header("x-user-id", "u1")
            .body(body);
        if let Some(t) = content_type {
            req = req.header("content-type", t);
        }
        req.send()
    };
    const FORM: Option<&str> = Some("application/x-www-form-urlencoded");

    // The form: the token guard's (no token, 400; a token, once).
    let bare = post(FORM, "sku=a1".into()).await.unwrap();
    assert_eq!(
        code(bare).await,
        (StatusCode::BAD_REQUEST, "missing_token".into())
    );
    let token = token_for(&g, "u1").await["repeatToken"]
        .as_str()
        .unwrap()
        .to_owned();
    let form = format!("sku=a1&repeatToken={token}");
    assert_eq!(post(FORM, form.clone()).await.unwrap().status(), 201);
    let again = post(FORM, form).await.unwrap();
    assert_eq!(
        code(again).await,
        (StatusCode::CONFLICT, "duplicate_submission".into())
    );

    // The JSON client needs no token: the fingerprint's (the same body
    // twice is a duplicate), whatever the type's case and parameters.
    let order = r#"{"sku":"a1","qty":1}"#;
    let json = post(Some("application/json"), order.into()).await.unwrap();
    assert_eq!(json.status(), 201);
    let twice = post(Some("Application/JSON; charset=utf-8"), order.into())
        .await
        .unwrap();
    assert_eq!(
        code(twice).await,
        (StatusCode::CONFLICT, "duplicate_submission".into())
    );

    // text/plain, or no type at all: the path's route without one (a
    // token), never the pass-through.
    for t in [Some("text/plain"), None] {
        let other = post(t, order.into()).await.unwrap();
        assert_eq!(
            code(other).await,
            (StatusCode::BAD_REQUEST, "missing_token".into()),
            "{t:?}"
        );
    }
    // Two types at once: no type (a backend might read either).
    let (status, text) = raw(
        &g,
        "POST /orders",
        &[
            ("x-user-id", "u1"),
            ("content-type", "application/json"),
            ("content-type", "application/x-www-form-urlencoded"),
        ],
        r#"{"sku":"b2"}"#,
    )
    .await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("missing_token"), "{text}");
    // One form order, one JSON order.
    assert_eq!(effects(&b).await["/orders"], 2);
}

/// Without a guarded route for the other types, a JSON client would post
/// `text/plain` and walk past the fingerprint: `check` refuses the file,
/// and the gateway does not start on it.
#[tokio::test]
async fn a_guarded_type_whose_other_types_pass_unguarded_is_refused() {
    let yaml = file_for(9, "memory", TYPED);
    let path = temp_file("yaml", yaml.as_bytes());
    let check = std::process::Command::new(env!("CARGO_BIN_EXE_norepeat-gateway"))
        .arg("check")
        .arg(&path)
        .env_clear()
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&check.stderr);
    assert_eq!(check.status.code(), Some(2), "{err}");
    assert!(
        err.contains("routes[1].content_type: POST /orders is guarded only for application/json: a body of another type (or none) reaches the same upstream unguarded (the pass-through)"),
        "{err}"
    );
    let start = Command::new(env!("CARGO_BIN_EXE_norepeat-gateway"))
        .args([
            "--config",
            &path.to_string_lossy(),
            "--listen",
            "127.0.0.1:0",
        ])
        .env_clear()
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), start)
        .await
        .expect("a refused file ends the start")
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is guarded only for application/json"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_file(path);
}
