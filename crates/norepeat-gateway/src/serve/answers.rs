//! The gateway's own answers (RFC 9457 problem+json, each with its
//! `code`): what it says itself, as opposed to what a backend or a
//! library layer says.

use axum::body::Body;
use http::{Response, StatusCode};
use norepeat::body::BodyError;
use norepeat::problem::Problem;
use norepeat::token::NotReached;

/// 413 `payload_too_large`: a body over the route's `max_request_body`.
pub(crate) fn payload_too_large(max: usize) -> Response<Body> {
    problem_response(&Problem::from(BodyError::TooLarge { max }))
}

/// `p` as a response; its code (in the `Problem` the response carries)
/// names the request's outcome.
pub(crate) fn problem_response(p: &Problem) -> Response<Body> {
    p.to_response().map(Body::new)
}

pub(crate) fn upstream_unavailable() -> Response<Body> {
    let p = Problem::custom(
        StatusCode::BAD_GATEWAY,
        "upstream_unavailable",
        "Upstream unavailable",
    )
    .detail("The upstream refused the connection or could not be reached; nothing reached it.");
    let mut res = problem_response(&p);
    // Nothing was sent: a token route gives the token back for the retry.
    res.extensions_mut().insert(NotReached);
    res
}

/// 400 `invalid_request`: the client's request, refused for `why`.
pub(crate) fn invalid_request(why: &'static str) -> Response<Body> {
    problem_response(&Problem::new(norepeat::problem::Code::InvalidRequest).detail(why))
}

/// 400 `invalid_request`: the client's body broke off on its way (a
/// malformed chunk, a stall past `body_timeout`, a request still coming at
/// `request_timeout`). The backend never got a
/// whole request: a token route gives the token back.
pub(crate) fn client_body_broke() -> Response<Body> {
    let mut res = invalid_request(
        "The request body broke off before it was whole (a malformed chunk, a pause past the gateway's body_timeout, or the whole request past its request_timeout); nothing was done with it.",
    );
    res.extensions_mut().insert(NotReached);
    res
}

pub(crate) fn upstream_timeout() -> Response<Body> {
    let p = Problem::custom(StatusCode::GATEWAY_TIMEOUT, "upstream_timeout", "Upstream timeout")
        .detail("The upstream did not answer in time, or the connection broke after the request was sent: the outcome is unknown.");
    problem_response(&p)
}

/// 502 `upstream_switched_protocols`: the upstream answered 101 to a
/// request that did not ask for that protocol (or asked for one the file's
/// `upgrades` does not forward); nothing was switched.
pub(crate) fn upstream_switched() -> Response<Body> {
    let p = Problem::custom(
        StatusCode::BAD_GATEWAY,
        "upstream_switched_protocols",
        "Bad gateway",
    )
    .detail("The upstream answered 101 Switching Protocols to a request that did not ask for that protocol; the connection was not switched.");
    problem_response(&p)
}

/// 503 `records_lost`: the store lost its records a moment ago
/// (`on_data_loss.hold`); a retry of a request made before could run it
/// again.
pub(crate) fn records_lost() -> Response<Body> {
    let p = Problem::custom(
        StatusCode::SERVICE_UNAVAILABLE,
        "records_lost",
        "Service unavailable",
    )
    .detail("The store that keeps this route's idempotency records lost them a moment ago; a retry of a request made before could run it again, so none runs for now.")
    .retry_after_secs(60);
    problem_response(&p)
}

/// 421 `misdirected_request`: a Host that is not one of the file's
/// `hosts`.
pub(crate) fn misdirected() -> Response<Body> {
    let p = Problem::custom(
        StatusCode::MISDIRECTED_REQUEST,
        "misdirected_request",
        "Misdirected request",
    )
    .detail("This gateway does not serve the site the request names (its Host or its target's authority).");
    problem_response(&p)
}
