//! The norepeat demo shop: an order flow guarded by every layer of the
//! `norepeat` library, with the `storm` and `reconcile` commands (`bench`
//! is the `norepeat-bench` crate's, run by the binary).
//!
//! The binary is `norepeat`; its routes are in its OpenAPI document. [`routes::app`]
//! builds the router, so tests drive it without a socket.

pub mod app;
pub mod commands;
pub mod config;
pub mod db;
pub mod domain;
pub mod error;
pub mod events;
pub mod order_messages;
pub mod outage;
pub mod payments_store;
pub mod routes;
