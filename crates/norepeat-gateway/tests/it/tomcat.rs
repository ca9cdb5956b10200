//! The gateway in front of a real Tomcat 10: every spelling that Tomcat
//! runs as `POST /payments` meets the route's guard or is refused, and one
//! key is one payment whichever spelling carries it. Tomcat drops each
//! segment's `;` parameters before it merges `//` and resolves `..`
//! (`/;x/payments` is `//payments`, so `/payments`); with its lenient
//! connector options it takes `\` and `%5C` for `/` as well. Before the
//! gateway read a segment made of parameters alone as empty, each of these
//! passed its route by and ran a payment with no key.

use crate::common::*;
use norepeat_testkit::{Tomcat, TomcatConnector};

/// Spellings Tomcat runs as `/payments` on either connector (the test
/// ends by sending each to Tomcat itself, to check).
const SEMICOLON: [&str; 20] = [
    "/;x/payments",
    "/;jsessionid=x/payments",
    "/;/payments",
    "/a/;x/../payments",
    "/;x/./payments",
    "/x/;/../payments",
    "/payments/;x",
    "/payments;x/;y",
    "/payments/x/;/..",
    "/payments;x;y",
    "/payments;x",
    "/payments/",
    "/payments//",
    "/.;/payments",
    "/%2e;x/payments",
    "/x/..;/payments",
    "/pay%6Dents",
    "/payments;x%5C..",
    "http://127.0.0.1/;x/payments",
    "http://127.0.0.1/payments/;x",
];

/// Spellings only the lenient connector runs as `/payments` (the default
/// one answers 400): backslashes, raw or encoded, in a segment's name or
/// beside its parameters (which Tomcat drops first).
const BACKSLASH: [&str; 14] = [
    "/payments\\x/..",
    "/payments%5Cx/..",
    "/x\\..\\payments",
    "/payments\\",
    "/\\payments",
    "/x/..\\payments",
    "/x\\..\\payments;a\\b",
    "/x\\..\\;y/payments",
    "/payments%5C",
    "/payments%5c",
    "/x%5C..%5Cpayments",
    "/x%5C..%5Cpayments;a%5Cb",
    "/x%5C..%5C;y/payments",
    "http://127.0.0.1/x%5C..%5Cpayments",
];

/// A gateway file for Tomcat's `port`: the payment route (a key required)
/// and, when `catch_all`, a route after it that only routes the rest to
/// Tomcat (otherwise the rest passes through as no route's).
fn file_for_tomcat(port: u16, catch_all: bool) -> String {
    let rest = if catch_all {
        format!("  - match: ANY /{{*rest}}\n    upstream: http://127.0.0.1:{port}\n")
    } else {
        String::new()
    };
    format!(
        "upstream: http://127.0.0.1:{port}\nstore: memory\nroutes:\n  - match: POST /payments\n    guard: idempotency\n    required: true\n{rest}"
    )
}

#[tokio::test]
async fn every_spelling_tomcat_runs_as_a_payment_is_guarded_or_refused() {
    let tomcat = Tomcat::start().await;
    let json = ("content-type", "application/json");
    for connector in [TomcatConnector::Default, TomcatConnector::Lenient] {
        for catch_all in [false, true] {
            let g = gateway(&file_for_tomcat(tomcat.port(connector), catch_all)).await;
            let case = format!("{connector:?} connector, catch-all route {catch_all}");
            let before = tomcat.payments().await.len();
            // No key: the guard's 400, or the gateway's refusal. Every
            // spelling is tried before the check, so a failure lists all
            // that got through.
            let mut passed = Vec::new();
            for target in SEMICOLON.iter().chain(&BACKSLASH) {
                let (status, _) = raw(&g, &format!("POST {target}"), &[json], "{}").await;
                if !(400..500).contains(&status) {
                    passed.push(format!("{target} ({status})"));
                }
            }
            let run = tomcat.payments().await;
            assert!(
                passed.is_empty() && run.len() == before,
                "{case}: without a key, {} answered other than 4xx: {passed:?}; Tomcat ran {} payments: {:?}",
                passed.len(),
                run.len() - before,
                &run[before..]
            );
            // One key: one payment, every other spelling a replay or refused.
            let key = format!("k-{}", rand_n());
            let keyed = [json, ("idempotency-key", key.as_str())];
            let (status, first) = raw(&g, "POST /payments", &keyed, "{}").await;
            assert_eq!(status, 201, "{case}: {first}");
            let mut ran = Vec::new();
            for target in SEMICOLON.iter().chain(&BACKSLASH) {
                let (status, text) = raw(&g, &format!("POST {target}"), &keyed, "{}").await;
                let replayed = text
                    .to_ascii_lowercase()
                    .contains("idempotent-replayed: true");
                if !((status == 201 && replayed) || (400..500).contains(&status)) {
                    ran.push(format!("{target} ({status})"));
                }
            }
            let run = tomcat.payments().await;
            assert!(
                ran.is_empty() && run.len() == before + 1,
                "{case}: one key, {} spellings neither replayed nor refused: {ran:?}; Tomcat ran {} payments: {:?}",
                ran.len(),
                run.len() - before,
                &run[before..]
            );
        }
    }
    // The lists are of real dangers: Tomcat itself runs each as a payment.
    for (connector, targets) in [
        (TomcatConnector::Default, &SEMICOLON[..]),
        (TomcatConnector::Lenient, &SEMICOLON[..]),
        (TomcatConnector::Lenient, &BACKSLASH[..]),
    ] {
        for target in targets {
            let status = tomcat.post(connector, target).await;
            assert_eq!(status, 201, "{connector:?}: Tomcat on POST {target}");
        }
    }
    // Debian's connector as shipped refuses a backslash itself.
    for target in &BACKSLASH {
        let status = tomcat.post(TomcatConnector::Default, target).await;
        assert_eq!(status, 400, "Default: Tomcat on POST {target}");
    }
}
