//! The file of the `gateway` defence's `norepeat-gateway` processes (started
//! with the test kit's `GatewayProcess`).
//!
//! The file guards the shop's order routes as a team putting the gateway in
//! front of an unguarded service would, for the way its clients call them
//! `POST /orders` carries a page token (`Repeat-Token`,
//! now issued by the gateway's `GET /.norepeat/token`), `POST /orders/quick`
//! nothing but its body (the fingerprint), `POST /payments` an
//! `Idempotency-Key`. The token secret is given in the file, so both
//! instances sign alike from their first request.

/// The file of one storm gateway: `upstream` is its shop, `store` the
/// Redis both instances share, `secret` the run's token secret.
pub(super) fn storm_file(upstream: &str, store: &str, secret: &str) -> String {
    format!(
        r"upstream: {upstream}
store: {store}
token_secret: {secret}
identity:
  header: X-User-Id
  required: true
routes:
  - match: POST /orders
    guard: token
  - match: POST /orders/quick
    guard: fingerprint
    window: 3s
    ignore_fields: [traceId, timestamp, random, sign]
  - match: POST /payments
    guard: idempotency
    required: true
    retention: 24h
  - match: POST /flash-sale/{{sku}}
    rate_limit: {{ algorithm: gcra, rate: 5/s, burst: 5, by: identity }}
"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_storm_file_guards_each_order_route_by_what_its_clients_send() {
        let f = storm_file("http://127.0.0.1:1", "redis://127.0.0.1:2", "s");
        for (route, guard) in [
            ("POST /orders\n", "guard: token"),
            ("POST /orders/quick\n", "guard: fingerprint"),
            ("POST /payments\n", "guard: idempotency"),
        ] {
            let at = f.find(route).unwrap_or_else(|| panic!("{route} in {f}"));
            let next = f[at..].lines().nth(1).unwrap_or_default();
            assert_eq!(next.trim(), guard, "{route}");
        }
        assert!(f.contains("POST /flash-sale/{sku}"), "{f}");
    }
}
