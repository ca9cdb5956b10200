//! The log phase: one access-log line per request ([`access`]), the id
//! that names the request ([`request_id`]) and the Prometheus series
//! ([`metrics`]).

pub(crate) mod access;
pub(crate) mod metrics;
pub(crate) mod request_id;
