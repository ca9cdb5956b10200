// Over 400 lines on purpose: one table of fields, defaults and problems, sharing the helpers at its top.
//! Every field of the file, its default, and its problems.

use super::walk::parse_size;
use super::*;

const UP: &str = "upstream: http://127.0.0.1:9000\n";

fn ok(text: &str) -> Config {
    Config::parse("t.yaml", text.as_bytes()).unwrap_or_else(|p| panic!("{p}"))
}

/// The one problem of `text`, as `LINE:COLUMN FIELD: MESSAGE`.
fn bad(text: &str) -> Vec<String> {
    let problems = Config::parse("t.yaml", text.as_bytes()).expect_err(text);
    problems
        .list()
        .iter()
        .map(|p| {
            format!(
                "{}:{} {}: {}",
                p.line.unwrap_or(0),
                p.column.unwrap_or(0),
                p.field,
                p.message
            )
        })
        .collect()
}

fn one_route(fields: &str) -> String {
    format!("{UP}routes:\n  - match: POST /r\n{fields}")
}

fn route(fields: &str) -> Route {
    ok(&one_route(fields)).routes.remove(0)
}

fn assert_one(text: &str, prefix: &str, contains: &str) {
    let got = bad(text);
    assert_eq!(got.len(), 1, "{got:#?}");
    assert!(
        got[0].starts_with(prefix) && got[0].contains(contains),
        "{:?} does not start with {prefix:?} and contain {contains:?}",
        got[0]
    );
}

#[test]
fn the_smallest_file_takes_every_default() {
    let c = ok(UP);
    assert_eq!(c.listen, "127.0.0.1:8090".parse().unwrap());
    assert_eq!(c.upstream.as_str(), "http://127.0.0.1:9000");
    assert_eq!(c.store, StoreUrl::Memory);
    assert_eq!(c.store.as_url(), None);
    assert_eq!(c.identity.source, IdentitySource::PeerAddress);
    assert!(c.identity.trusted_proxies.is_empty());
    assert!(!c.identity.required);
    assert_eq!(c.token_secret, None);
    assert!(c.routes.is_empty());
}

#[test]
fn a_route_takes_every_default() {
    let r = route("    guard: token\n");
    assert_eq!(r.matcher.to_string(), "POST /r");
    assert_eq!(r.guard, Some(Guard::Token));
    assert_eq!(r.rate_limit, None);
    assert!(!r.shadow);
    assert_eq!(r.upstream.as_str(), "http://127.0.0.1:9000");
    assert_eq!(r.on_store_failure, OnStoreFailure::Open);
    assert_eq!(r.max_request_body, 64 * 1024);
    assert_eq!(r.max_stored_response, 1024 * 1024);
    assert_eq!(r.timeout, Duration::from_secs(30));
}

#[test]
fn fingerprint_defaults_and_fields() {
    let defaults = || -> Vec<String> {
        ["traceId", "timestamp", "random", "sign"]
            .map(String::from)
            .into()
    };
    let r = route("    guard: fingerprint\n");
    assert_eq!(
        r.guard,
        Some(Guard::Fingerprint {
            window: Duration::from_secs(3),
            ignore_fields: defaults(),
        })
    );
    assert_eq!(r.on_store_failure, OnStoreFailure::Open);
    let r = route("    guard: fingerprint\n    window: 250ms\n    ignore_fields: [traceId, ts]\n");
    let mut with_ts = defaults();
    with_ts.push("ts".into());
    assert_eq!(
        r.guard,
        Some(Guard::Fingerprint {
            window: Duration::from_millis(250),
            ignore_fields: with_ts,
        })
    );
    // Issue 40: a file can make the library's default fields count.
    let r = route(
        "    guard: fingerprint\n    ignore_default_fields: false\n    ignore_fields: [ts]\n",
    );
    assert_eq!(
        r.guard,
        Some(Guard::Fingerprint {
            window: Duration::from_secs(3),
            ignore_fields: vec!["ts".into()],
        })
    );
    assert_one(
        &one_route("    guard: token\n    ignore_default_fields: false\n"),
        "5:28 routes[0].ignore_default_fields:",
        "only a fingerprint route",
    );
}

#[test]
fn idempotency_defaults_and_fields() {
    let r = route("    guard: idempotency\n");
    assert_eq!(
        r.guard,
        Some(Guard::Idempotency {
            required: true,
            retention: Duration::from_secs(24 * 3600),
            ambiguous: Ambiguous::Keep,
            reconcile: None,
        })
    );
    assert_eq!(r.on_store_failure, OnStoreFailure::Closed);
    let r = route(
        "    guard: idempotency\n    required: false\n    retention: 5m\n    ambiguous: release\n    on_store_failure: open\n",
    );
    assert_eq!(
        r.guard,
        Some(Guard::Idempotency {
            required: false,
            retention: Duration::from_secs(300),
            ambiguous: Ambiguous::Release,
            reconcile: None,
        })
    );
    assert_eq!(r.on_store_failure, OnStoreFailure::Open);
}

#[test]
fn a_reconcile_lookup_is_a_get_of_a_path_with_the_key() {
    let r = route(
        "    guard: idempotency\n    reconcile: { lookup: \"GET /payments/by-key/{key}\" }\n",
    );
    let Some(Guard::Idempotency { reconcile, .. }) = r.guard else {
        panic!("an idempotency route")
    };
    assert_eq!(
        reconcile,
        Some(Lookup {
            path: "/payments/by-key/{key}".into()
        })
    );
    for (fields, says) in [
        (
            "reconcile: { lookup: \"POST /p/{key}\" }",
            "a lookup is a GET",
        ),
        ("reconcile: { lookup: \"GET /p\" }", "must hold {key} once"),
        (
            "reconcile: { lookup: \"GET /p/{key}/{id}\" }",
            "no other braces",
        ),
        ("reconcile: { lookup: \"GET p/{key}\" }", "an absolute path"),
        ("reconcile: {}", "needs a lookup"),
        (
            "reconcile: { lookup: \"GET /p/{key}\", cache: 1s }",
            "unknown field",
        ),
        (
            "ambiguous: release\n    reconcile: { lookup: \"GET /p/{key}\" }",
            "needs ambiguous: keep",
        ),
    ] {
        let got = bad(&one_route(&format!(
            "    guard: idempotency\n    {fields}\n"
        )));
        assert!(
            got.iter()
                .any(|p| p.contains("reconcile") && p.contains(says)),
            "{fields}: {got:?}"
        );
    }
    let got = bad(&one_route(
        "    guard: token\n    reconcile: { lookup: \"GET /p/{key}\" }\n",
    ));
    assert!(
        got.iter()
            .any(|p| p.contains("only an idempotency route has reconcile")),
        "{got:?}"
    );
}

#[test]
fn on_repeat_replays_on_token_and_fingerprint_routes_only() {
    assert_eq!(route("    guard: fingerprint\n").on_repeat, None);
    let r = route("    guard: fingerprint\n    on_repeat: replay\n");
    assert_eq!(r.on_repeat, Some(Duration::from_secs(5)));
    let r = route("    guard: token\n    on_repeat: replay\n    wait: 2s\n");
    assert_eq!(r.on_repeat, Some(Duration::from_secs(2)));
    assert_eq!(
        route("    guard: token\n    on_repeat: refuse\n").on_repeat,
        None
    );
    for (fields, says) in [
        (
            "guard: idempotency\n    on_repeat: replay",
            "only a token or fingerprint route",
        ),
        (
            "guard: token\n    on_repeat: again",
            "expected refuse or replay",
        ),
        (
            "guard: token\n    wait: 2s",
            "only a route with on_repeat: replay waits",
        ),
    ] {
        let got = bad(&one_route(&format!("    {fields}\n")));
        assert!(got.iter().any(|p| p.contains(says)), "{fields}: {got:?}");
    }
}

#[test]
fn route_overrides() {
    let r = route(
        "    guard: token\n    shadow: true\n    upstream: http://10.0.0.2:8000/base/\n    on_store_failure: closed\n    max_request_body: 1MiB\n    max_stored_response: 4096\n    timeout: 2s\n",
    );
    assert!(r.shadow);
    assert_eq!(r.upstream.as_str(), "http://10.0.0.2:8000/base");
    assert_eq!(r.on_store_failure, OnStoreFailure::Closed);
    assert_eq!(r.max_request_body, 1 << 20);
    assert_eq!(r.max_stored_response, 4096);
    assert_eq!(r.timeout, Duration::from_secs(2));
}

/// Issue 38: a route may only route (its own `upstream`, no guard), a
/// `match` may end in `{*rest}` and take `ANY` method, and a route may
/// name a `host`.
#[test]
fn a_route_may_only_route_and_name_its_host() {
    let config = ok(&format!(
        "{UP}routes:\n  - match: ANY /api/{{*rest}}\n    host: API.Example.com.\n    upstream: http://10.0.0.7:8000\n  - match: ANY /api/{{*rest}}\n    guard: fingerprint\n"
    ));
    let r = &config.routes[0];
    assert_eq!(r.guard, None);
    assert_eq!(r.rate_limit, None);
    assert_eq!(r.host.as_deref(), Some("api.example.com"));
    assert_eq!(r.upstream.as_str(), "http://10.0.0.7:8000");
    assert_eq!(
        r.max_request_body,
        u64::MAX,
        "a routing route streams any body"
    );
    // The same match for every other site is reachable after it.
    assert_eq!(config.routes[1].host, None);
    assert_eq!(config.routes[1].max_request_body, 64 * 1024);
    // One for every site hides a later one for a site.
    let hidden = format!(
        "{UP}routes:\n  - match: ANY /api/{{*rest}}\n    upstream: http://10.0.0.7:8000\n  - match: POST /api/x\n    host: a.example\n    guard: token\n"
    );
    assert_one(&hidden, "5:12 routes[1].match:", "never reached: routes[0]");
    assert_one(
        &one_route("    host: a/b\n    guard: token\n"),
        "4:11 routes[0].host:",
        "a host name",
    );
}

#[test]
fn rate_limits() {
    let r = route("    rate_limit: { rate: 5/s }\n");
    let rl = r.rate_limit.expect("a rate limit");
    assert_eq!(rl.algorithm, Algorithm::Gcra);
    assert_eq!(rl.quota, Quota::parse("5/s").unwrap());
    assert_eq!(rl.quota.burst().get(), 5);
    assert_eq!(rl.by, LimitBy::Identity);
    assert_eq!(r.guard, None);
    assert_eq!(r.on_store_failure, OnStoreFailure::Open);

    let rl = route("    rate_limit: { algorithm: gcra, rate: 10/m, burst: 2, by: address }\n")
        .rate_limit
        .expect("a rate limit");
    assert_eq!(rl.quota.burst().get(), 2);
    assert_eq!(rl.quota.period(), Duration::from_secs(60));
    assert_eq!(rl.by, LimitBy::Address);
    for (name, want) in [
        ("fixed", Algorithm::FixedWindow),
        ("fixed_window", Algorithm::FixedWindow),
        ("sliding", Algorithm::SlidingWindow),
        ("sliding_window", Algorithm::SlidingWindow),
    ] {
        let rl = route(&format!(
            "    rate_limit: {{ algorithm: {name}, rate: 1/h, by: ip }}\n"
        ))
        .rate_limit
        .expect("a rate limit");
        assert_eq!((rl.algorithm, rl.by), (want, LimitBy::Address), "{name}");
    }
    // A guard and a rate limit on one route.
    let r = route("    guard: token\n    rate_limit:\n      rate: 1/s\n");
    assert!(r.guard.is_some() && r.rate_limit.is_some());
}

#[test]
fn rate_limit_problems() {
    let r = |f: &str| one_route(&format!("    rate_limit: {f}\n"));
    assert_one(
        &r("{ rate: 5/d }"),
        "4:25 routes[0].rate_limit.rate:",
        "unit",
    );
    assert_one(
        &r("{ rate: 5 }"),
        "4:25 routes[0].rate_limit.rate:",
        "expected a string",
    );
    assert_one(
        &r("{ rate: 0/s }"),
        "4:25 routes[0].rate_limit.rate:",
        "whole number",
    );
    assert_one(
        &r("{ burst: 2 }"),
        "4:17 routes[0].rate_limit.rate:",
        "missing",
    );
    assert_one(
        &r("{ rate: 1/s, burst: 0 }"),
        "4:37 routes[0].rate_limit.burst:",
        "found 0",
    );
    assert_one(
        &r("{ rate: 1/s, burst: x }"),
        "4:37 routes[0].rate_limit.burst:",
        "found a string",
    );
    assert_one(
        &r("{ algorithm: fixed, rate: 1/s, burst: 2 }"),
        "4:55 routes[0].rate_limit.burst:",
        "only gcra",
    );
    assert_one(
        &r("{ algorithm: leaky, rate: 1/s }"),
        "4:30 routes[0].rate_limit.algorithm:",
        "leaky",
    );
    assert_one(
        &r("{ rate: 1/s, by: user }"),
        "4:34 routes[0].rate_limit.by:",
        "user",
    );
    assert_one(
        &r("{ rate: 1/s, per: 1s }"),
        "4:30 routes[0].rate_limit.per:",
        "unknown field",
    );
    assert_one(
        &r("5/s"),
        "4:17 routes[0].rate_limit:",
        "expected a mapping",
    );
}

#[test]
fn identity_forms() {
    let c = ok(&format!(
        "{UP}identity:\n  header: X-User-Id\n  trusted_proxies: [10.0.0.0/8, 192.168.1.1, \"::1/128\"]\n  required: true\n"
    ));
    assert_eq!(
        c.identity.source,
        IdentitySource::Header("x-user-id".into())
    );
    assert_eq!(
        c.identity.trusted_proxies,
        vec![
            "10.0.0.0/8".parse::<IpNet>().unwrap(),
            "192.168.1.1/32".parse().unwrap(),
            "::1/128".parse().unwrap()
        ]
    );
    assert!(c.identity.required);
    assert_eq!(
        ok(&format!("{UP}identity: ip\n")).identity,
        Identity::default()
    );
    let c = ok(&format!(
        "{UP}identity:\n  ip: true\n  trusted_proxies: [10.0.0.0/8]\n"
    ));
    assert_eq!(c.identity.source, IdentitySource::PeerAddress);
    assert_eq!(c.identity.trusted_proxies.len(), 1);
}

#[test]
fn identity_problems() {
    let id = |f: &str| format!("{UP}identity:\n{f}");
    assert_one(
        &id("  header: X User\n"),
        "3:11 identity.header:",
        "not a header name",
    );
    assert_one(
        &id("  header: 5\n"),
        "3:11 identity.header:",
        "expected a string",
    );
    assert_one(
        &id("  trusted_proxies: [10.0.0.0/33]\n"),
        "3:21 identity.trusted_proxies[0]:",
        "10.0.0.0/33",
    );
    assert_one(
        &id("  trusted_proxies: 10.0.0.0/8\n"),
        "3:20 identity.trusted_proxies:",
        "expected a list",
    );
    assert_one(
        &id("  required: true\n"),
        "3:13 identity.required:",
        "needs a header",
    );
    assert_one(
        &id("  header: A\n  ip: true\n"),
        "4:7 identity.ip:",
        "twice",
    );
    assert_one(&id("  ip: false\n"), "3:7 identity.ip:", "names no caller");
    assert_one(
        &id("  user: sid\n"),
        "3:3 identity.user:",
        "unknown field; expected one of header, cookie, jwt, introspect, ip, any_of,",
    );
    assert_one(
        &id("  header: IP\n"),
        "3:11 identity.header:",
        "write `ip: true` for the peer address",
    );
    assert_one(
        &id("  cookie: sid\n  header: X-User-Id\n"),
        "4:11 identity.header:",
        "cookie and header name the caller twice",
    );
    assert_one(
        &format!("{UP}identity: user\n"),
        "2:11 identity:",
        "expected ip",
    );
}

/// Parses `text` with `env` as the environment, in this crate's
/// directory (so `tests/files/jwt/...` is found).
fn in_env(text: &str, env: &[(&str, &[u8])]) -> Result<Config, Problems> {
    let env: Vec<(String, Vec<u8>)> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.to_vec()))
        .collect();
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/g.yaml");
    Config::parse_in(file, text.as_bytes(), &move |name: &str| {
        env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    })
}

#[test]
fn cookie_jwt_and_any_of_identities() {
    let c = ok(&format!(
        "{UP}identity: {{ cookie: sid, required: true }}\n"
    ));
    assert_eq!(c.identity.source, IdentitySource::Cookie("sid".into()));
    let c = in_env(
        &format!("{UP}identity:\n  any_of:\n    - {{ jwt: {{ claim: uid, secret_env: S }} }}\n    - cookie: sid\n    - header: X-User-Id\n    - ip: true\n"),
        &[("S", &[b'k'; 32])],
    )
    .unwrap();
    let IdentitySource::AnyOf(list) = &c.identity.source else {
        panic!("{:?}", c.identity.source)
    };
    assert!(
        matches!(&list[0], IdentitySource::Jwt(j) if j.claim == "uid"
        && matches!(&j.keys, JwtKeys::Secret { env, secret } if env == "S" && secret.as_bytes() == [b'k'; 32]))
    );
    assert_eq!(list[1], IdentitySource::Cookie("sid".into()));
    assert_eq!(list[2], IdentitySource::Header("x-user-id".into()));
    assert_eq!(list[3], IdentitySource::PeerAddress);
    assert!(
        !format!("{c:?}").contains("kkkk"),
        "the secret is never shown"
    );
    for file in ["tests/files/jwt/jwks.json", "tests/files/jwt/ec1.pub.pem"] {
        let c = in_env(
            &format!("{UP}identity: {{ jwt: {{ public_keys: {file}, issuer: https://id.example, audiences: [shop] }} }}\n"),
            &[],
        )
        .unwrap_or_else(|p| panic!("{p}"));
        let IdentitySource::Jwt(j) = c.identity.source else {
            panic!()
        };
        assert_eq!(j.claim, "sub", "the default claim");
        assert_eq!(j.issuer.as_deref(), Some("https://id.example"));
        assert!(matches!(j.keys, JwtKeys::PublicKeys(p) if p.is_absolute() && p.exists()));
    }
}

#[test]
fn jwt_and_any_of_problems() {
    let jwt = |f: &str| format!("{UP}identity:\n  jwt: {f}\n");
    let one = |text: &str, env: &[(&str, &[u8])], prefix: &str, contains: &str| {
        let got = in_env(text, env).expect_err(text).to_string();
        assert_eq!(got.lines().count(), 1, "{got}");
        assert!(got.contains(prefix) && got.contains(contains), "{got}");
    };
    one(
        &jwt("{ secret_env: JWT_SECRET }"),
        &[],
        ":3:22: identity.jwt.secret_env:",
        "JWT_SECRET is not set",
    );
    one(
        &jwt("{ secret_env: S }"),
        &[("S", b"short")],
        "identity.jwt.secret_env:",
        "5 bytes; an HS256 secret needs at least 32",
    );
    one(
        &jwt("{ claim: sub }"),
        &[],
        "identity.jwt:",
        "missing secret_env",
    );
    one(
        &jwt("{ secret_env: S, public_keys: k.pem }"),
        &[("S", &[1; 32])],
        "identity.jwt.public_keys:",
        "keep one",
    );
    one(
        &jwt("{ public_keys: nowhere.pem }"),
        &[],
        "identity.jwt.public_keys:",
        "cannot read",
    );
    one(
        &jwt("{ public_keys: tests/files/jwt/ec1.key }"),
        &[],
        "identity.jwt.public_keys:",
        "give the public key",
    );
    one(
        &jwt("{ public_keys: tests/files/jwt/ec1.pub.pem, alg: HS256 }"),
        &[],
        "identity.jwt.alg:",
        "unknown field",
    );
    let any = |items: &str| format!("{UP}identity:\n  any_of: {items}\n");
    one(&any("[]"), &[], "identity.any_of:", "names no caller");
    one(
        &any("[{ ip: true }, { cookie: sid }]"),
        &[],
        "identity.any_of[0]:",
        "put ip last",
    );
    one(
        &any("[{ any_of: [{ cookie: a }] }]"),
        &[],
        "identity.any_of[0].any_of:",
        "inside an any_of",
    );
    one(
        &any("[{ cookie: a, header: B }]"),
        &[],
        "identity.any_of[0].header:",
        "twice",
    );
    one(
        &any("[{ ip: true }]\n  required: true"),
        &[],
        "identity.required:",
        "always known",
    );
    one(
        &any("[{ header: ip }]"),
        &[],
        "identity.any_of[0].header:",
        "ip: true",
    );
}

#[test]
fn an_introspect_identity_and_its_defaults() {
    let c = ok(&format!(
        "{UP}identity:\n  introspect:\n    path: /api/whoami?full=1\n    user: {{ header: X-User-Id }}\n    cache: 5m\n    timeout: 2s\n  required: true\n"
    ));
    assert_eq!(
        c.identity.source,
        IdentitySource::Introspect(Introspect {
            path: "/api/whoami?full=1".into(),
            user: IntrospectUser::Header("x-user-id".into()),
            cache: Duration::from_secs(300),
            timeout: Duration::from_secs(2),
        })
    );
    assert!(c.identity.required);
    let c = ok(&format!(
        "{UP}identity: {{ any_of: [{{ cookie: sid }}, {{ introspect: {{ path: /me, user: {{ json: \"/a~1b/0\" }} }} }}] }}\n"
    ));
    let IdentitySource::AnyOf(list) = &c.identity.source else {
        panic!("{:?}", c.identity.source)
    };
    assert_eq!(
        list[1],
        IdentitySource::Introspect(Introspect {
            path: "/me".into(),
            user: IntrospectUser::Json("/a~1b/0".into()),
            cache: DEFAULT_INTROSPECT_CACHE,
            timeout: DEFAULT_INTROSPECT_TIMEOUT,
        })
    );
    // A route's own.
    let r = route(
        "    guard: idempotency\n    identity: { introspect: { path: /me, user: { json: /id } } }\n",
    );
    assert!(matches!(
        r.identity.map(|i| i.source),
        Some(IdentitySource::Introspect(_))
    ));
}

#[test]
fn introspect_problems_name_their_field() {
    let id = |f: &str| format!("{UP}identity:\n  introspect: {f}\n");
    for (block, prefix, message) in [
        (
            "{ path: /me, user: { json: /id }, ttl: 5s }",
            "3:49 identity.introspect.ttl:",
            "unknown field",
        ),
        (
            "{ path: /me, user: { json: user/id } }",
            "3:42 identity.introspect.user.json:",
            "not a JSON pointer",
        ),
        (
            "{ path: /me, user: { json: /a~2 } }",
            "3:42 identity.introspect.user.json:",
            "not a JSON pointer",
        ),
        (
            "{ path: /me, user: { header: X User } }",
            "3:44 identity.introspect.user.header:",
            "not a header name",
        ),
        (
            "{ path: /me, user: { header: X-U, json: /id } }",
            "3:55 identity.introspect.user.json:",
            "keep one",
        ),
        (
            "{ path: /me, user: {} }",
            "3:34 identity.introspect.user:",
            "expected { header",
        ),
        (
            "{ path: /me, user: { json: /id }, cache: 60 }",
            "3:56 identity.introspect.cache:",
            "no unit",
        ),
        (
            "{ path: /me, user: { json: /id }, timeout: soon }",
            "3:58 identity.introspect.timeout:",
            "expected a duration",
        ),
        (
            "{ path: /me, user: { json: /id }, timeout: 0s }",
            "3:58 identity.introspect.timeout:",
            "above zero",
        ),
        (
            "{ path: whoami, user: { json: /id } }",
            "3:23 identity.introspect.path:",
            "expected a path",
        ),
        (
            "{ path: \"/who ami\", user: { json: /id } }",
            "3:23 identity.introspect.path:",
            "expected a path",
        ),
        (
            "{ user: { json: /id } }",
            "3:15 identity.introspect:",
            "missing path",
        ),
        ("{ path: /me }", "3:15 identity.introspect:", "missing user"),
    ] {
        assert_one(&id(block), prefix, message);
    }
    assert_one(
        &format!(
            "{UP}identity:\n  any_of:\n    - introspect: {{ path: /a, user: {{ json: /id }} }}\n    - introspect: {{ path: /b, user: {{ json: /id }} }}\n"
        ),
        "5:7 identity.any_of[1]:",
        "a second introspect",
    );
}

#[test]
fn a_route_may_name_its_own_identity() {
    let c = ok(&format!(
        "{UP}identity: {{ header: X-User-Id, trusted_proxies: [10.0.0.0/8] }}\nroutes:\n  - match: POST /pay\n    guard: idempotency\n    identity: {{ cookie: sid, required: true }}\n  - match: POST /b\n    guard: fingerprint\n"
    ));
    let own = c.routes[0].identity.as_ref().unwrap();
    assert_eq!(own.source, IdentitySource::Cookie("sid".into()));
    assert!(own.required);
    assert_eq!(
        own.trusted_proxies, c.identity.trusted_proxies,
        "the file's proxies"
    );
    assert_eq!(c.routes[1].identity, None);
    assert_one(
        &one_route("    guard: token\n    identity: { cookie: sid }\n"),
        "5:15 routes[0].identity:",
        "a token route takes the file's identity",
    );
    assert_one(
        &one_route(
            "    guard: fingerprint\n    identity: { cookie: sid, trusted_proxies: [10.0.0.0/8] }\n",
        ),
        "5:47 routes[0].identity.trusted_proxies:",
        "the file's",
    );
}

#[test]
fn token_ttl_and_cors() {
    let c = ok(UP);
    assert_eq!(c.token_ttl, Duration::from_secs(60));
    assert!(c.cors.allow_origins.is_empty());
    let c = ok(&format!(
        "{UP}token_ttl: 5m\ncors: {{ allow_origins: [https://Shop.Example, \"http://localhost:3000\", \"https://b.example:443\"] }}\n"
    ));
    assert_eq!(c.token_ttl, Duration::from_secs(300));
    assert_eq!(
        c.cors.allow_origins,
        [
            "https://shop.example",
            "http://localhost:3000",
            "https://b.example"
        ]
    );
    assert_one(
        &format!("{UP}token_ttl: 60\n"),
        "2:12 token_ttl:",
        "has no unit",
    );
    assert_one(
        &format!("{UP}cors: {{ allow_origins: [\"*\"] }}\n"),
        "2:25 cors.allow_origins[0]:",
        "list the origins",
    );
    assert_one(
        &format!("{UP}cors: {{ allow_origins: [https://shop.example/] }}\n"),
        "2:25 cors.allow_origins[0]:",
        "write https://shop.example",
    );
    assert_one(
        &format!("{UP}cors: {{ allow_origins: [shop.example] }}\n"),
        "2:25 cors.allow_origins[0]:",
        "http:// or https://",
    );
}

#[test]
fn listen_upstream_and_store() {
    let c = ok(&format!(
        "listen: 127.0.0.1:0\n{UP}store: redis+cluster://a:7000,b:7001\n"
    ));
    assert_eq!(c.listen.port(), 0);
    assert_eq!(
        c.store,
        StoreUrl::Cluster("redis+cluster://a:7000,b:7001".into())
    );
    for url in [
        "redis://127.0.0.1:6379",
        "redis://localhost",
        "redis://:pw@h:1/2",
        "rediss://h:6380",
        "redis://[::1]:6379",
    ] {
        assert_eq!(ok(&format!("{UP}store: {url}\n")).store.as_url(), Some(url));
    }
    assert_eq!(ok(&format!("{UP}store: memory\n")).store, StoreUrl::Memory);
    assert_eq!(
        ok("upstream: http://[::1]:9000/\n").upstream.as_str(),
        "http://[::1]:9000"
    );
    assert_eq!(
        ok("upstream: http://backend\n").upstream.as_str(),
        "http://backend"
    );
    assert_eq!(
        ok("listen: \"[::1]:8090\"\nupstream: http://b\n")
            .listen
            .port(),
        8090
    );
}

#[test]
fn listen_upstream_and_store_problems() {
    assert_one(&format!("listen: here\n{UP}"), "1:9 listen:", "\"here\"");
    assert_one(
        &format!("listen: 8090\n{UP}"),
        "1:9 listen:",
        "expected a string",
    );
    assert_one("upstream: ftp://a:1\n", "1:11 upstream:", "or https://");
    assert_one("upstream: http://a:x\n", "1:11 upstream:", "not a port");
    assert_one("upstream: http://a:0\n", "1:11 upstream:", "not a port");
    assert_one("upstream: http://\n", "1:11 upstream:", "not a host");
    assert_one(
        "upstream: http://u:p@a:1\n",
        "1:11 upstream:",
        "credentials",
    );
    assert_one("upstream: http://a:1/?q\n", "1:11 upstream:", "query");
    assert_one("listen: 127.0.0.1:1\n", "1:1 upstream:", "missing");
    let store = |s: &str| format!("{UP}store: {s}\n");
    assert_one(
        &store("postgres://a"),
        "2:8 store:",
        "unknown store \"postgres\"",
    );
    assert_one(&store("redis://h:port"), "2:8 store:", "not a port");
    assert_one(
        &store("redis://h:1/db"),
        "2:8 store:",
        "database must be a number",
    );
    assert_one(&store("redis+cluster://a:1,b"), "2:8 store:", "no port");
    assert_one(&store("redis+cluster://a:1/0"), "2:8 store:", "no path");
    // A password is never repeated.
    let got = bad(&store("redis://:hunter2@h:x"));
    assert!(!got[0].contains("hunter2"), "{got:?}");
}

#[test]
fn token_secrets() {
    let long = "k".repeat(32);
    let c = ok(&format!("{UP}token_secret: {long}\n"));
    assert_eq!(
        c.token_secret.as_ref().map(TokenSecret::as_bytes),
        Some(long.as_bytes())
    );
    assert_eq!(
        format!("{:?}", c.token_secret),
        "Some(TokenSecret(32 bytes))"
    );
    assert_one(
        &format!("{UP}token_secret: short\n"),
        "2:15 token_secret:",
        "has 5",
    );
    // The environment's is used when the file has none; the file's wins.
    let env = [b'e'; 40];
    let c = Config::parse_with_env("t", UP.as_bytes(), Some(&env)).unwrap();
    assert_eq!(
        c.token_secret.map(|s| s.as_bytes().to_vec()),
        Some(env.to_vec())
    );
    let file = format!("{UP}token_secret: {long}\n");
    let c = Config::parse_with_env("t", file.as_bytes(), Some(b"x")).unwrap();
    assert_eq!(c.token_secret.map(|s| s.as_bytes().len()), Some(32));
    let p = Config::parse_with_env("t", UP.as_bytes(), Some(b"x")).unwrap_err();
    assert_eq!(
        p.to_string(),
        "NOREPEAT_GATEWAY_TOKEN_SECRET: a token secret needs at least 32 bytes, this one has 1\n"
    );
}

#[test]
fn fields_that_belong_to_another_guard() {
    let r = |f: &str| one_route(f);
    assert_one(
        &r("    guard: token\n    window: 3s\n"),
        "5:13 routes[0].window:",
        "only a fingerprint route has a window (this route's guard is token)",
    );
    assert_one(
        &r("    guard: idempotency\n    ignore_fields: [a]\n"),
        "5:20 routes[0].ignore_fields:",
        "only a fingerprint route",
    );
    for field in ["required: true", "retention: 1h", "ambiguous: keep"] {
        let name = field.split(':').next().unwrap();
        assert_one(
            &r(&format!("    guard: fingerprint\n    {field}\n")),
            &format!("5:{} routes[0].{name}:", 7 + name.len()),
            "only an idempotency route",
        );
    }
    assert_one(
        &r("    rate_limit: {rate: 1/s}\n    retention: 1h\n"),
        "5:16 routes[0].retention:",
        "this route has no guard",
    );
}

#[test]
fn route_problems() {
    let r = |f: &str| one_route(f);
    assert_one(
        &r(""),
        "3:5 routes[0]:",
        "a guard, a rate_limit or an upstream",
    );
    assert_one(
        &r("    shadow: true\n"),
        "3:5 routes[0]:",
        "a guard, a rate_limit or an upstream",
    );
    assert_one(
        &r("    guard: captcha\n"),
        "4:12 routes[0].guard:",
        "\"captcha\"",
    );
    assert_one(
        &r("    guard: token\n    shadow: yes\n"),
        "5:13 routes[0].shadow:",
        "true or false",
    );
    assert_one(
        &r("    guard: token\n    timeout: 30\n"),
        "5:14 routes[0].timeout:",
        "no unit",
    );
    assert_one(
        &r("    guard: token\n    timeout: 3 parsecs\n"),
        "5:14 routes[0].timeout:",
        "duration",
    );
    assert_one(
        &r("    guard: token\n    max_request_body: 0\n"),
        "5:23 routes[0].max_request_body:",
        "above zero",
    );
    assert_one(
        &r("    guard: token\n    max_stored_response: 1MB\n"),
        "5:26 routes[0].max_stored_response:",
        "1MiB",
    );
    assert_one(
        &r("    guard: token\n    on_store_failure: maybe\n"),
        "5:23 routes[0].on_store_failure:",
        "open or closed",
    );
    assert_one(
        &r("    guard: token\n    upstream: ftp://x\n"),
        "5:15 routes[0].upstream:",
        "http://",
    );
    assert_one(
        &r("    guard: fingerprint\n    ignore_fields: [a, \"\"]\n"),
        "5:24 routes[0].ignore_fields[1]:",
        "empty",
    );
    assert_one(
        &r("    guard: fingerprint\n    ignore_fields: a\n"),
        "5:20 routes[0].ignore_fields:",
        "expected a list",
    );
    assert_one(
        &r("    guard: token\n    gaurd: token\n"),
        "5:5 routes[0].gaurd:",
        "unknown field; did you mean guard?",
    );
    assert_one(
        &format!("{UP}routes:\n  - guard: token\n"),
        "3:5 routes[0].match:",
        "missing",
    );
    assert_one(
        &format!("{UP}routes:\n  - match: POST\n    guard: token\n"),
        "3:12 routes[0].match:",
        "METHOD PATH",
    );
    assert_one(
        &format!("{UP}routes: {{}}\n"),
        "2:9 routes:",
        "expected a list",
    );
    assert_one(
        &format!("{UP}routes:\n  - POST /x\n"),
        "3:5 routes[0]:",
        "expected a mapping",
    );
}

/// A bad guard field does not hide the route's other problems: `check`
/// prints one line per problem, all of them at once.
#[test]
fn a_bad_guard_field_does_not_hide_the_routes_other_problems() {
    let got = bad(&one_route(
        "    guard: idempotency\n    ambiguous: forget\n    on_store_failure: maybe\n    timeout: 0s\n",
    ));
    let fields: Vec<&str> = got
        .iter()
        .map(|p| p.split(' ').nth(1).unwrap_or_default())
        .collect();
    assert!(fields.contains(&"routes[0].ambiguous:"), "{got:#?}");
    assert!(fields.contains(&"routes[0].on_store_failure:"), "{got:#?}");
    let got = bad(&one_route(
        "    guard: fingerprint\n    window: forever\n    shadow: perhaps\n",
    ));
    assert_eq!(got.len(), 2, "{got:#?}");
    assert!(got[0].contains("routes[0].window:"), "{got:#?}");
    assert!(got[1].contains("routes[0].shadow:"), "{got:#?}");
}

#[test]
fn a_route_that_an_earlier_one_hides_is_a_problem() {
    let text = format!(
        "{UP}routes:\n  - match: POST /orders/{{id}}\n    guard: token\n  - match: GET /orders/quick\n    guard: token\n  - match: POST /orders/quick\n    guard: fingerprint\n"
    );
    assert_one(
        &text,
        "7:12 routes[2].match:",
        "never reached: routes[0] (POST /orders/{id}) takes every request it matches",
    );
}

#[test]
fn every_problem_is_reported_in_file_order() {
    let text = format!(
        "{UP}store: nope\nroutes:\n  - match: POST /a\n    guard: token\n    window: 1s\n  - match: GET /b\n    guard: fingerprint\n    window: 0s\nextra: 1\n"
    );
    let got = bad(&text);
    let fields: Vec<&str> = got
        .iter()
        .map(|l| l.split(':').nth(1).unwrap_or_default())
        .collect();
    assert_eq!(got.len(), 4, "{got:#?}");
    assert!(got[0].starts_with("2:8 store:"), "{got:#?}");
    assert!(got[1].starts_with("6:13 routes[0].window:"), "{got:#?}");
    assert!(got[2].starts_with("9:13 routes[1].window:"), "{got:#?}");
    assert!(got[3].starts_with("10:1 extra:"), "{got:#?}");
    assert_eq!(fields.len(), 4);
}

#[test]
fn file_level_problems() {
    assert_eq!(
        bad(""),
        vec!["1:0 upstream: missing (the file is empty); it is required"]
    );
    assert_eq!(bad("# only a comment\n"), bad(""));
    assert_one("[1, 2]\n", "1:1 :", "expected a mapping");
    assert_one("a: [1,\n", "2:1 :", "YAML syntax");
    assert_one("a: 1\na: 2\n", "2:1 :", "duplicated key");
    assert_one(&format!("{UP}---\n{UP}"), "3:1 :", "second YAML document");
    let got = Config::parse("t", b"upstream: x\n  \xc3\xa9\xff").unwrap_err();
    assert_eq!(
        got.to_string(),
        "t:2:4: the file is not UTF-8 (byte 0xff at offset 16)\n"
    );
    assert_one(
        &format!("{UP}? [a]\n: 1\n"),
        "2:3 :",
        "a field's name must be a string",
    );
    // Anchors and aliases are YAML's own: the parser resolves them.
    let c = ok(
        "upstream: &u http://a:1\nroutes:\n  - match: GET /\n    guard: token\n    upstream: *u\n",
    );
    assert_eq!(c.routes[0].upstream, c.upstream);
}

#[test]
fn problems_display_as_one_line_each() {
    let p = Config::parse("g.yaml", b"store: x\n").unwrap_err();
    assert_eq!(p.file(), "g.yaml");
    assert_eq!(
        p.to_string(),
        "g.yaml:1:1: upstream: missing; it is required (http://host:port)\n\
         g.yaml:1:8: store: unknown store \"x\"; expected memory, redis://host:port[/db], redis+sentinel://host:port,host:port/MASTER_NAME or redis+cluster://host:port,host:port (each may end with ?replicas=N&replicas_timeout=T)\n"
    );
    let unreadable = Config::load(Path::new("/nonexistent/gateway.yaml")).unwrap_err();
    assert!(
        unreadable
            .to_string()
            .starts_with("/nonexistent/gateway.yaml: cannot read the file: "),
        "{unreadable}"
    );
}

#[test]
fn sizes() {
    for (s, want) in [
        ("1", 1),
        ("65536", 65536),
        ("512B", 512),
        ("64KiB", 65536),
        ("64 KiB", 65536),
        ("1MiB", 1 << 20),
        ("2GiB", 2 << 30),
    ] {
        assert_eq!(parse_size(s), Ok(want), "{s}");
    }
    for s in [
        "0",
        "0KiB",
        "",
        "KiB",
        "1KB",
        "1mb",
        "-1",
        "1.5MiB",
        "99999999999999999999GiB",
    ] {
        assert!(parse_size(s).is_err(), "{s}");
    }
}

#[test]
fn durations_are_the_library_grammar() {
    for (s, want) in [
        ("250ms", 250),
        ("3s", 3000),
        ("5m", 300_000),
        ("24h", 86_400_000),
        ("2min", 120_000),
    ] {
        let r = route(&format!("    guard: token\n    timeout: {s}\n"));
        assert_eq!(r.timeout, Duration::from_millis(want), "{s}");
    }
}

#[test]
fn the_first_matching_route_takes_the_request() {
    let c = ok(&format!(
        "{UP}routes:\n  - match: POST /a/b\n    guard: token\n  - match: POST /a/{{x}}\n    guard: fingerprint\n  - match: GET /a/{{x}}\n    rate_limit: {{ rate: 1/s }}\n"
    ));
    let at = |m: &str, p: &str| c.route_for(m, p).map(|(i, _)| i);
    assert_eq!(at("POST", "/a/b"), Some(0));
    assert_eq!(at("POST", "/a/c"), Some(1));
    assert_eq!(at("GET", "/a/b"), Some(2));
    assert_eq!(at("PUT", "/a/b"), None);
    assert_eq!(at("POST", "/a"), None);
}

#[test]
fn a_misspelt_field_gets_the_nearest_name() {
    let r = |f: &str| one_route(&format!("    guard: fingerprint\n{f}"));
    assert_one(
        &r("    windwo: 3s\n"),
        "5:5 routes[0].windwo:",
        "did you mean window?",
    );
    assert_one(
        &r("    ignore_field: [a]\n"),
        "5:5 routes[0].ignore_field:",
        "did you mean ignore_fields?",
    );
    assert_one(
        &format!("{UP}stroe: memory\n"),
        "2:1 stroe:",
        "did you mean store?",
    );
    assert_eq!(super::walk::edits("", "ab"), 2);
    assert_eq!(super::walk::edits("kitten", "sitting"), 3);
}

/// `limits`: the contract's defaults, each field settable, a bad value
/// named by its field (before: `limits` was an unknown field, and a file
/// written to the contract failed `check`).
#[test]
fn limits_have_defaults_and_are_checked() {
    let l = ok(UP).limits;
    assert_eq!(l.header_timeout, Duration::from_secs(10));
    assert_eq!(l.idle_timeout, Duration::from_secs(60));
    assert_eq!(l.body_timeout, Duration::from_secs(30));
    assert_eq!(l.max_connections.get(), 10_000);
    let l = ok(&format!(
        "{UP}limits:\n  header_timeout: 2s\n  idle_timeout: 75s\n  body_timeout: 500ms\n  max_connections: 64\n"
    ))
    .limits;
    assert_eq!(
        (
            l.header_timeout,
            l.idle_timeout,
            l.body_timeout,
            l.max_connections.get()
        ),
        (
            Duration::from_secs(2),
            Duration::from_secs(75),
            Duration::from_millis(500),
            64
        )
    );
    assert_one(
        &format!("{UP}limits:\n  idle_timeout: 60\n"),
        "3:17 limits.idle_timeout",
        "no unit",
    );
    assert_one(
        &format!("{UP}limits:\n  max_connections: 0\n"),
        "3:20 limits.max_connections",
        "whole number",
    );
    assert_one(
        &format!("{UP}limits:\n  keepalive: 5s\n"),
        "3:3 limits.keepalive",
        "",
    );
}

/// `drain_delay: 0s` turns the drain off (an ops choice); any other zero
/// duration in the file is still a problem.
#[test]
fn a_drain_delay_may_be_zero() {
    let c = ok(&format!("drain_delay: 0s\n{UP}"));
    assert_eq!(c.drain_delay, Duration::ZERO);
    assert_eq!(ok(UP).drain_delay, Duration::from_secs(5));
    assert_one(
        &one_route("    guard: fingerprint\n    window: 0s\n"),
        "5:13 routes[0].window:",
        "above zero",
    );
}

/// Issue 52: `request_timeout` bounds the whole request (a trickled body
/// never pauses past `body_timeout`), `max_streams` an HTTP/2
/// connection's requests at once.
#[test]
fn the_whole_request_and_the_streams_of_a_connection_are_bounded() {
    let l = ok(UP).limits;
    assert_eq!(l.request_timeout, Duration::from_secs(60));
    assert_eq!(l.max_streams.get(), 100);
    let l = ok(&format!(
        "{UP}limits:\n  request_timeout: 15s\n  max_streams: 8\n"
    ))
    .limits;
    assert_eq!(
        (l.request_timeout, l.max_streams.get()),
        (Duration::from_secs(15), 8)
    );
    assert_one(
        &format!("{UP}limits:\n  header_timeout: 20s\n  request_timeout: 15s\n"),
        "4:20 limits.request_timeout",
        "at least header_timeout",
    );
}

/// Issue 52: `upgrades` names what is forwarded (WebSocket by default);
/// `h2c` never is.
#[test]
fn upgrades_are_listed_and_h2c_is_refused() {
    assert_eq!(ok(UP).upgrades, ["websocket"]);
    assert_eq!(
        ok(&format!("{UP}upgrades: [WebSocket, echo]\n")).upgrades,
        ["websocket", "echo"]
    );
    assert!(ok(&format!("{UP}upgrades: []\n")).upgrades.is_empty());
    assert_one(
        &format!("{UP}upgrades: [websocket, h2c]\n"),
        "2:23 upgrades[1]:",
        "h2c is never forwarded",
    );
}

/// Issue 52: `hosts` names the site; a guarded route scoped to one host
/// whose method and path another Host takes to the same backend
/// unguarded is a problem (a client names another Host and walks past).
#[test]
fn hosts_and_a_guard_another_host_walks_past() {
    assert!(ok(UP).hosts.is_empty());
    assert_eq!(
        ok(&format!("{UP}hosts: [Pay.Example., www.pay.example:443]\n")).hosts,
        ["pay.example", "www.pay.example"]
    );
    assert_one(
        &format!("{UP}hosts: [x@pay.example]\n"),
        "2:9 hosts[0]:",
        "a host name",
    );
    let guarded = "  - match: POST /payments\n    host: pay.example\n    guard: idempotency\n";
    // Any other Host reaches /payments through the pass-through.
    assert_one(
        &format!("{UP}routes:\n{guarded}"),
        "0:0 routes[0].host:",
        "under any other Host it reaches the same upstream unguarded (the pass-through)",
    );
    // ... or through a catch-all to the same backend.
    assert_one(
        &format!(
            "{UP}routes:\n{guarded}  - match: ANY /{{*rest}}\n    upstream: http://127.0.0.1:9000/v1\n"
        ),
        "0:0 routes[0].host:",
        "(routes[1])",
    );
    // `hosts` with the site's one name: every other Host is refused.
    ok(&format!("{UP}hosts: [pay.example]\nroutes:\n{guarded}"));
    // Another name of `hosts` is another Host.
    assert_one(
        &format!("{UP}hosts: [pay.example, www.pay.example]\nroutes:\n{guarded}"),
        "0:0 routes[0].host:",
        "under the Host www.pay.example",
    );
    // The operator's own route for that other name says it is meant.
    ok(&format!(
        "{UP}hosts: [pay.example, www.pay.example]\nroutes:\n{guarded}  - match: POST /payments\n    host: www.pay.example\n    upstream: http://127.0.0.1:9000\n"
    ));
    // Another backend is another service.
    ok(&format!(
        "upstream: http://127.0.0.1:9001\nroutes:\n{guarded}    upstream: http://127.0.0.1:9000\n"
    ));
    // A route for a site `hosts` does not list is never reached.
    assert_one(
        &format!(
            "{UP}hosts: [pay.example]\nroutes:\n  - match: POST /x\n    host: other.example\n    guard: token\n"
        ),
        "0:0 routes[0].host:",
        "not one of hosts",
    );
}

/// Issue 51: `records` is a database URL (PostgreSQL, or a SQLite file
/// relative to the file's folder); memory or Redis is no place for records
/// meant to outlive the store.
#[test]
fn records_name_a_database() {
    assert_eq!(ok(UP).records, None);
    let c = ok(&format!("{UP}records: postgres://gw@127.0.0.1/gw\n"));
    assert_eq!(c.records.unwrap().as_url(), "postgres://gw@127.0.0.1/gw");
    let c = Config::parse(
        "/etc/gw/g.yaml",
        format!("{UP}records: sqlite:records.db\n").as_bytes(),
    )
    .unwrap();
    assert_eq!(c.records.unwrap().as_url(), "sqlite:///etc/gw/records.db");
    for (bad, why) in [
        ("redis://127.0.0.1:6379", "not a database URL"),
        ("\"sqlite::memory:\"", "a file is needed"),
        ("postgres://", "no host"),
    ] {
        assert_one(&format!("{UP}records: {bad}\n"), "2:10 records:", why);
    }
}

/// Issue 54: `${NAME}` in any string value is the environment variable
/// (`$${` a literal `${`); one that is not set is a problem where it is
/// named, in `check` as at start.
#[test]
fn secrets_come_from_the_environment() {
    let env = |name: &str| match name {
        "REDIS_PASSWORD" => Some(b"s3cret".to_vec()),
        "UPSTREAM" => Some(b"http://10.0.0.7:8000".to_vec()),
        _ => None,
    };
    let c = Config::parse_in(
        "t.yaml",
        b"upstream: ${UPSTREAM}\nstore: redis://:${REDIS_PASSWORD}@127.0.0.1:6379\ntoken_secret: $${not-a-variable}-and-long-enough-for-a-secret\n",
        &env,
    )
    .unwrap();
    assert_eq!(c.upstream.as_str(), "http://10.0.0.7:8000");
    assert_eq!(c.store.as_url(), Some("redis://:s3cret@127.0.0.1:6379"));
    assert!(
        c.token_secret
            .unwrap()
            .as_bytes()
            .starts_with(b"${not-a-variable}-"),
        "$${{ is a literal ${{"
    );
    let problems = Config::parse_in(
        "t.yaml",
        b"upstream: http://127.0.0.1:9\ntoken_secret: ${TOKEN_SECRET}\n",
        &env,
    )
    .unwrap_err()
    .to_string();
    assert!(
        problems.contains("t.yaml:2:15")
            && problems.contains("the environment variable TOKEN_SECRET is not set"),
        "{problems}"
    );
    let unclosed = bad(&format!("{UP}token_secret: \"${{TOKEN\"\n"));
    assert!(
        unclosed[0].starts_with("2:15 :") && unclosed[0].contains("without its `}`"),
        "{unclosed:?}"
    );
}

/// Issue 54: `check` fails exactly where start would: an admin token
/// variable that is not set, or too short.
#[test]
fn an_admin_token_variable_is_checked_as_at_start() {
    let file = format!("{UP}admin: {{ listen: 127.0.0.1:9091, token_env: ADMIN_T }}\n");
    let with = |v: Option<&[u8]>| {
        let v = v.map(<[u8]>::to_vec);
        Config::parse_in("t.yaml", file.as_bytes(), &move |n: &str| {
            (n == "ADMIN_T").then(|| v.clone()).flatten()
        })
    };
    assert!(with(Some(b"a-token-long-enough")).is_ok());
    let unset = with(None).unwrap_err().to_string();
    assert!(
        unset.contains("admin.token_env: ADMIN_T is not set"),
        "{unset}"
    );
    let short = with(Some(b"short")).unwrap_err().to_string();
    assert!(short.contains("fewer than 16 characters"), "{short}");
    // `public` names own routes the traffic's listener keeps.
    let c = ok(&format!(
        "{UP}admin: {{ listen: 127.0.0.1:9091, public: [healthz] }}\n"
    ));
    assert_eq!(c.admin.unwrap().public, ["healthz"]);
    assert_one(
        &format!("{UP}admin: {{ listen: 127.0.0.1:9091, public: [records] }}\n"),
        "2:43 admin.public[0]:",
        "expected one of healthz, readyz, metrics",
    );
}
