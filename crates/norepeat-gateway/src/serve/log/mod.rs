//! The log phase: one access-log line per request ([`access`]) and the
//! Prometheus series ([`metrics`]).

pub(crate) mod access;
pub(crate) mod metrics;
