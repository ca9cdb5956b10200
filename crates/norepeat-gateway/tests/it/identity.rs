// Over 400 lines: every identity source through the binary, sharing its files and the backend that echoes who called.
//! Who the caller is, served (issue 38, "An identity that survives a
//! retry"): one named cookie, a verified bearer JWT's claim, the first of
//! several sources, a route's own identity; and the tokens a page uses (a
//! token from a plain form, `token_ttl`, CORS for `GET /.norepeat/token`).
//! Against the real gateway binary and the Python backend of
//! `tests/backend.py`, which counts what it runs.
//!
//! The keys under `tests/files/jwt/` were made for these tests alone
//! (`openssl genpkey`): `ec1`, `ec2` (P-256) and `rsa1` (2048 bits), their
//! public halves as PEM, and `jwks.json` (`rsa-1`, `ec-1` and an Ed25519 key
//! the gateway leaves out), `jwks-rotated.json` (`ec-2` alone).

// Test code: a failure is a panic with its place.

use crate::common::{Process, backend, effects, gateway_env, temp_file, token_for, url};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::{Client, RequestBuilder, Response, StatusCode};
use serde_json::{Value, json};
use std::time::Duration;

const KEYS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/files/jwt/");

/// The gateway in front of `b`, its file `yaml` after the upstream, with
/// the variables `env`.
async fn gateway(b: &Process, yaml: &str, env: &[(&str, &str)]) -> Process {
    gateway_env(
        &format!("upstream: http://127.0.0.1:{}\n{yaml}", b.port),
        env,
    )
    .await
}

/// `GET path` of the backend, as JSON.
async fn backend_json(b: &Process, path: &str) -> Value {
    reqwest::get(url(b, path))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// How many times the backend ran `path`.
async fn runs(b: &Process, path: &str) -> u64 {
    effects(b).await[path].as_u64().unwrap_or(0)
}

/// A payment with `key`: the same body every time.
fn pay(g: &Process, key: &str) -> RequestBuilder {
    Client::new()
        .post(url(g, "/payments"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(r#"{"amount":5}"#)
}

/// The status, whether it was a replay, and the problem's code (if any).
async fn outcome(res: Response) -> (StatusCode, bool, String) {
    let status = res.status();
    let replayed = res.headers().contains_key("idempotent-replayed");
    let body: Value = res.json().await.unwrap_or(Value::Null);
    let code = body["code"].as_str().unwrap_or_default().to_owned();
    (status, replayed, code)
}

const CREATED: (StatusCode, bool, &str) = (StatusCode::CREATED, false, "");
const REPLAYED: (StatusCode, bool, &str) = (StatusCode::CREATED, true, "");
const UNAUTHENTICATED: (StatusCode, bool, &str) =
    (StatusCode::UNAUTHORIZED, false, "unauthenticated");

async fn assert_outcome(req: RequestBuilder, want: (StatusCode, bool, &str), what: &str) {
    let (s, r, c) = outcome(req.send().await.unwrap()).await;
    assert_eq!((s, r, c.as_str()), want, "{what}");
}

const PAYMENTS: &str = "routes:
  - match: POST /payments
    guard: idempotency
    retention: 1m
";

/// The issue's reproduction: an analytics cookie that changes between an
/// attempt and its retry made the retry a new caller (`header: Cookie`),
/// and the payment ran twice. With `cookie: sid` it is one caller, the
/// retry is a replay, and the backend ran the payment once. Before this
/// change the file did not parse (`cookie` was an unknown field).
#[tokio::test]
async fn a_cookie_that_changes_beside_the_named_one_does_not_run_a_payment_twice() {
    let b = backend(0).await;
    let g = gateway(
        &b,
        &format!("identity: {{ cookie: sid, required: true }}\n{PAYMENTS}"),
        &[],
    )
    .await;
    assert_outcome(
        pay(&g, "pay-1").header("cookie", "sid=abc; _ga=GA1.1.111"),
        CREATED,
        "the first attempt",
    )
    .await;
    // The retry: another _ga, the cookies in another order, and split over
    // two header lines (as HTTP/2 sends them).
    assert_outcome(
        pay(&g, "pay-1")
            .header("cookie", "_ga=GA1.1.222")
            .header("cookie", "sid=abc"),
        REPLAYED,
        "the retry with a changed _ga",
    )
    .await;
    let attempts = backend_json(&b, "/attempts").await;
    assert_eq!(attempts["/payments"], json!(["1"]), "the payment ran once");
    // Another session with the same key is another caller.
    assert_outcome(
        pay(&g, "pay-1").header("cookie", "sid=xyz; _ga=GA1.1.111"),
        CREATED,
        "another session",
    )
    .await;
    assert_outcome(
        pay(&g, "pay-1").header("cookie", "_ga=GA1.1.111"),
        UNAUTHENTICATED,
        "no sid",
    )
    .await;
    // Two values of the named cookie: the client does not choose.
    assert_outcome(
        pay(&g, "pay-2").header("cookie", "sid=abc; sid=xyz"),
        UNAUTHENTICATED,
        "sid twice",
    )
    .await;
    assert_eq!(runs(&b, "/payments").await, 2);
}

/// The finding: `sid=abc`, `sid="abc"` (RFC 6265's quoted form),
/// `sid="\141bc"` (an octal escape, undone by Python's `http.cookies` and
/// werkzeug) and `sid=%61bc` (percent-encoded, decoded by Express's
/// `cookie`) are one session to the backend's framework, and were three
/// callers here (only the quotes were dropped): one Idempotency-Key ran
/// the payment three times, and a 2/m rate limit let all four through.
/// Now each is the caller `abc`: one payment, replayed to the others, and
/// one budget. A quote left open (`"abc1`: Express's `cookie` 0.x reads
/// `abc`, Python `"abc1`, Tomcat `abc1`) is no caller.
#[tokio::test]
async fn every_spelling_of_one_session_cookie_is_one_caller() {
    let b = backend(0).await;
    let g = gateway(
        &b,
        &format!(
            "identity: {{ cookie: sid, required: true }}\n{PAYMENTS}  - match: POST /flash\n    rate_limit: {{ rate: 2/m, by: identity }}\n"
        ),
        &[],
    )
    .await;
    let spellings = [r"sid=abc", r#"sid="abc""#, r#"sid="\141bc""#, r"sid=%61bc"];
    assert_outcome(
        pay(&g, "pay-1").header("cookie", spellings[0]),
        CREATED,
        spellings[0],
    )
    .await;
    for cookie in &spellings[1..] {
        assert_outcome(pay(&g, "pay-1").header("cookie", *cookie), REPLAYED, cookie).await;
    }
    assert_eq!(runs(&b, "/payments").await, 1, "one payment");
    // Another session is still another caller; a quote left open is none.
    assert_outcome(
        pay(&g, "pay-1").header("cookie", "sid=%61bd"),
        CREATED,
        "another session",
    )
    .await;
    assert_outcome(
        pay(&g, "pay-1").header("cookie", r#"sid="abc1"#),
        UNAUTHENTICATED,
        "a quote left open",
    )
    .await;

    let flash = |cookie: &str| {
        Client::new()
            .post(url(&g, "/flash"))
            .header("cookie", cookie)
            .body("{}")
    };
    let mut statuses = Vec::new();
    for cookie in spellings {
        statuses.push(flash(cookie).send().await.unwrap().status().as_u16());
    }
    assert_eq!(statuses, [201, 201, 429, 429], "one budget of 2/m");
    assert_eq!(runs(&b, "/flash").await, 2);
}

fn now() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

fn hs256(secret: &[u8], claims: &Value) -> String {
    let key = EncodingKey::from_secret(secret).unwrap();
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &key).unwrap()
}

/// A token signed with the private key file `key` (`.key` under
/// `tests/files/jwt`), naming `kid`.
fn signed(alg: Algorithm, key: &str, kid: Option<&str>, claims: &Value) -> String {
    let pem = std::fs::read(format!("{KEYS}{key}")).unwrap();
    let key = match alg {
        Algorithm::RS256 => EncodingKey::from_rsa_pem(&pem),
        _ => EncodingKey::from_ec_pem(&pem),
    }
    .unwrap();
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, &key).unwrap()
}

fn bearer(req: RequestBuilder, token: &str) -> RequestBuilder {
    req.header("authorization", format!("Bearer {token}"))
}

const SECRET: &str = "a-secret-of-at-least-thirty-two-bytes!";

/// HS256: the claim of a token that verifies is the caller, across a
/// token refresh (a new token for the same `sub` is the same caller, as
/// the issue asks of `Authorization`); a token badly signed, expired or
/// unsigned (`alg: none`) is 401 and never reaches the backend, even
/// though the identity is not `required` (a request without any token
/// falls back to the address).
#[tokio::test]
async fn a_verified_jwt_names_the_caller_and_any_other_token_is_401() {
    let b = backend(0).await;
    let g = gateway(
        &b,
        &format!("identity:\n  jwt: {{ claim: sub, secret_env: JWT_SECRET }}\n{PAYMENTS}"),
        &[("JWT_SECRET", SECRET)],
    )
    .await;
    let s = SECRET.as_bytes();
    let first = hs256(s, &json!({"sub": "u1", "iat": now(), "exp": now() + 300}));
    let refreshed = hs256(
        s,
        &json!({"sub": "u1", "iat": now() + 1, "exp": now() + 900}),
    );
    assert_outcome(bearer(pay(&g, "k1"), &first), CREATED, "u1").await;
    assert_outcome(
        bearer(pay(&g, "k1"), &refreshed),
        REPLAYED,
        "u1 after a refresh",
    )
    .await;
    let u2 = hs256(s, &json!({"sub": "u2", "exp": now() + 300}));
    assert_outcome(bearer(pay(&g, "k1"), &u2), CREATED, "u2").await;
    assert_eq!(runs(&b, "/payments").await, 2);

    let claims = json!({"sub": "u1", "exp": now() + 300});
    let foreign = hs256(b"another-secret-of-thirty-two-bytes!!", &claims);
    let expired = hs256(s, &json!({"sub": "u1", "exp": now() - 3600}));
    let payload = first.split('.').nth(1).unwrap();
    // {"alg":"none","typ":"JWT"}: the claims of `first`, unsigned.
    let unsigned = format!("eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.{payload}.");
    let no_sub = hs256(s, &json!({"name": "u1", "exp": now() + 300}));
    for (token, what) in [
        (foreign.as_str(), "another secret"),
        (expired.as_str(), "expired"),
        (unsigned.as_str(), "alg none"),
        (no_sub.as_str(), "no sub claim"),
        ("not-a-jwt", "malformed"),
    ] {
        assert_outcome(bearer(pay(&g, "k2"), token), UNAUTHENTICATED, what).await;
    }
    assert_eq!(runs(&b, "/payments").await, 2, "no refused token ran");
    // No token at all: the address, as the identity is not required.
    assert_outcome(pay(&g, "k2"), CREATED, "anonymous").await;
}

/// RS256 and ES256 from a JWKS file (by `kid`) and from a PEM file; the
/// JWKS file is read again when it changes: a rotated key is taken, the
/// key it replaced no longer is.
#[tokio::test]
async fn rs256_and_es256_verify_from_a_jwks_and_a_pem_file_read_again_on_change() {
    let b = backend(0).await;
    let jwks = temp_file("json", &std::fs::read(format!("{KEYS}jwks.json")).unwrap());
    let g = gateway(
        &b,
        &format!(
            "identity:\n  jwt: {{ public_keys: {}, issuer: https://id.example }}\n{PAYMENTS}",
            jwks.display()
        ),
        &[],
    )
    .await;
    let claims = json!({"sub": "u1", "iss": "https://id.example", "exp": now() + 600});
    let rs = signed(Algorithm::RS256, "rsa1.key", Some("rsa-1"), &claims);
    let ec1 = signed(Algorithm::ES256, "ec1.key", Some("ec-1"), &claims);
    let ec2 = signed(Algorithm::ES256, "ec2.key", Some("ec-2"), &claims);
    assert_outcome(bearer(pay(&g, "rs"), &rs), CREATED, "RS256").await;
    assert_outcome(bearer(pay(&g, "ec"), &ec1), CREATED, "ES256").await;
    // The same sub by either key is one caller.
    assert_outcome(bearer(pay(&g, "rs"), &ec1), REPLAYED, "u1 by ES256").await;
    assert_outcome(bearer(pay(&g, "x"), &ec2), UNAUTHENTICATED, "unknown kid").await;
    let other_iss = signed(
        Algorithm::ES256,
        "ec1.key",
        Some("ec-1"),
        &json!({"sub": "u1", "iss": "https://evil.example", "exp": now() + 600}),
    );
    assert_outcome(bearer(pay(&g, "x"), &other_iss), UNAUTHENTICATED, "issuer").await;

    // Rotated: written beside, renamed into place.
    let next = jwks.with_extension("next");
    std::fs::copy(format!("{KEYS}jwks-rotated.json"), &next).unwrap();
    std::fs::rename(&next, &jwks).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut n = 0;
    loop {
        n += 1;
        let (s, _, _) = outcome(
            bearer(pay(&g, &format!("r{n}")), &ec2)
                .send()
                .await
                .unwrap(),
        )
        .await;
        if s == StatusCode::CREATED {
            break;
        }
        assert_eq!(s, StatusCode::UNAUTHORIZED);
        assert!(
            tokio::time::Instant::now() < deadline,
            "the rotated key was never read"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_outcome(bearer(pay(&g, "old"), &ec1), UNAUTHENTICATED, "the old key").await;

    // A PEM file: its key has no kid.
    let g = gateway(
        &b,
        &format!("identity:\n  jwt: {{ public_keys: {KEYS}ec1.pub.pem }}\n{PAYMENTS}"),
        &[],
    )
    .await;
    let plain = signed(Algorithm::ES256, "ec1.key", None, &claims);
    assert_outcome(bearer(pay(&g, "pem"), &plain), CREATED, "PEM ES256").await;
    assert_outcome(
        bearer(pay(&g, "pem2"), &rs),
        UNAUTHENTICATED,
        "RS256 on an EC PEM",
    )
    .await;
}

/// `any_of`: the first source present names the caller, and each kind is
/// its own space (a cookie `42` and a header `42` are two callers).
#[tokio::test]
async fn any_of_takes_the_first_source_present() {
    let b = backend(0).await;
    let g = gateway(
        &b,
        &format!(
            "identity:\n  any_of: [ {{ cookie: sid }}, {{ header: X-User-Id }} ]\n  required: true\n{PAYMENTS}"
        ),
        &[],
    )
    .await;
    let both = |user: &str| {
        pay(&g, "k")
            .header("cookie", "sid=42")
            .header("x-user-id", user)
    };
    assert_outcome(both("u1"), CREATED, "the cookie, u1 beside").await;
    assert_outcome(both("u2"), REPLAYED, "the cookie first: u2 is not read").await;
    let header = || pay(&g, "k").header("x-user-id", "42");
    assert_outcome(header(), CREATED, "the header 42 is not the cookie 42").await;
    assert_outcome(header(), REPLAYED, "the header 42 again").await;
    assert_outcome(pay(&g, "k"), UNAUTHENTICATED, "neither").await;
    assert_eq!(runs(&b, "/payments").await, 2);
}

/// A route's `identity` replaces the file's on that route only.
#[tokio::test]
async fn a_route_identity_overrides_the_files() {
    let b = backend(0).await;
    let g = gateway(
        &b,
        "identity: { header: X-User-Id, required: true }
routes:
  - match: POST /payments
    guard: idempotency
    identity: { cookie: sid, required: true }
  - match: POST /orders/quick
    guard: fingerprint
",
        &[],
    )
    .await;
    assert_outcome(
        pay(&g, "k").header("x-user-id", "u1"),
        UNAUTHENTICATED,
        "the route's cookie",
    )
    .await;
    assert_outcome(pay(&g, "k").header("cookie", "sid=s1"), CREATED, "with it").await;
    let quick = |user: Option<&str>| {
        let req = Client::new().post(url(&g, "/orders/quick")).body("{}");
        match user {
            Some(u) => req.header("x-user-id", u),
            None => req.header("cookie", "sid=s1"),
        }
    };
    assert_outcome(quick(None), UNAUTHENTICATED, "the file's header elsewhere").await;
    assert_outcome(quick(Some("u1")), CREATED, "the file's header").await;
}

/// A plain HTML form sends its token as a field: taken, and the body
/// reaches the backend byte for byte; the same form again is a duplicate,
/// one without a token is `missing_token`, one over `max_request_body` 413.
/// `token_ttl` is the token's `expiresIn`.
#[tokio::test]
async fn a_plain_form_sends_its_token_as_a_field() {
    let b = backend(0).await;
    let g = gateway(
        &b,
        "identity: { header: X-User-Id }
token_ttl: 5m
routes:
  - match: POST /orders
    guard: token
    max_request_body: 1KiB
",
        &[],
    )
    .await;
    let issued = token_for(&g, "u1").await;
    assert_eq!(issued["expiresIn"], 300, "token_ttl: 5m");
    let token = issued["repeatToken"].as_str().unwrap();
    let form = format!("sku=a1&repeatToken={token}&note=gift+wrap%21&qty=%C3%A92");
    let order = |body: String| {
        Client::new()
            .post(url(&g, "/orders"))
            .header("x-user-id", "u1")
            .header("x-echo-body", "1")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
    };
    let res = order(form.clone()).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let echoed: Value = res.json().await.unwrap();
    assert_eq!(
        echoed["body"],
        form.as_str(),
        "the body as the form sent it"
    );
    assert_outcome(
        order(form.clone()),
        (StatusCode::CONFLICT, false, "duplicate_submission"),
        "the form again",
    )
    .await;
    assert_outcome(
        order("sku=a1".into()),
        (StatusCode::BAD_REQUEST, false, "missing_token"),
        "no token",
    )
    .await;
    let big = token_for(&g, "u1").await["repeatToken"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_outcome(
        order(format!("repeatToken={big}&pad={}", "x".repeat(2048))),
        (StatusCode::PAYLOAD_TOO_LARGE, false, "payload_too_large"),
        "over max_request_body",
    )
    .await;
    assert_eq!(runs(&b, "/orders").await, 1);
}

/// `cors`: a listed origin's page may fetch a token with its cookies (its
/// preflight allowed, its origin echoed, credentials allowed); another
/// origin gets no `Access-Control-Allow-Origin`, which its browser refuses.
#[tokio::test]
async fn cors_lets_a_listed_page_fetch_its_token_and_no_other() {
    let b = backend(0).await;
    let g = gateway(
        &b,
        "identity: { cookie: sid, required: true }
cors: { allow_origins: [https://shop.example] }
routes:
  - match: POST /orders
    guard: token
",
        &[],
    )
    .await;
    let c = Client::new();
    let preflight = |origin: &str| {
        c.request(reqwest::Method::OPTIONS, url(&g, "/.norepeat/token"))
            .header("origin", origin)
            .header("access-control-request-method", "GET")
            .header("access-control-request-headers", "x-requested-with")
            .send()
    };
    let res = preflight("https://shop.example").await.unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let h = res.headers();
    assert_eq!(h["access-control-allow-origin"], "https://shop.example");
    assert_eq!(h["access-control-allow-credentials"], "true");
    assert_eq!(h["access-control-allow-methods"], "GET");
    assert_eq!(h["access-control-allow-headers"], "x-requested-with");
    assert_eq!(h["vary"], "Origin");
    let get = |origin: &str| {
        c.get(url(&g, "/.norepeat/token"))
            .header("origin", origin)
            .header("cookie", "sid=s1")
            .send()
    };
    let res = get("https://shop.example").await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        res.headers()["access-control-allow-origin"],
        "https://shop.example"
    );
    assert_eq!(res.headers()["access-control-allow-credentials"], "true");
    assert_eq!(res.headers()["vary"], "Origin");

    let res = preflight("https://evil.example").await.unwrap();
    assert!(!res.headers().contains_key("access-control-allow-origin"));
    let res = get("https://evil.example").await.unwrap();
    assert!(!res.headers().contains_key("access-control-allow-origin"));
    assert!(
        !res.headers()
            .contains_key("access-control-allow-credentials")
    );
    assert_eq!(res.headers()["vary"], "Origin");
}

/// `check` names the identity's problems: `header: ip` with its hint, a
/// secret's variable that is not set, a key file that cannot be read.
#[test]
fn check_names_the_identity_problems() {
    let check = |yaml: &str| {
        let file = temp_file(
            "yaml",
            format!("upstream: http://127.0.0.1:9\n{yaml}").as_bytes(),
        );
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_norepeat-gateway"))
            .arg("check")
            .arg(&file)
            .env_clear()
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = check("identity: { header: ip }\n");
    assert_eq!(code, Some(2));
    assert!(
        err.contains("identity.header: ") && err.contains("write `ip: true` for the peer address"),
        "{err}"
    );
    let (code, err) = check("identity: { jwt: { secret_env: JWT_SECRET } }\n");
    assert_eq!(code, Some(2));
    assert!(
        err.contains("identity.jwt.secret_env: JWT_SECRET is not set"),
        "{err}"
    );
    let (code, err) = check("identity: { jwt: { public_keys: /nowhere/keys.json } }\n");
    assert_eq!(code, Some(2));
    assert!(
        err.contains("identity.jwt.public_keys: cannot read /nowhere/keys.json"),
        "{err}"
    );
    let (code, out) = check(
        "identity: { ip: true }\ntoken_ttl: 2m\ncors: { allow_origins: [https://a.example] }\n",
    );
    assert_eq!(code, Some(0), "{out}");
}
