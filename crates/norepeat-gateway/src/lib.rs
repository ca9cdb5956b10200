//! `norepeat-gateway`: norepeat's guards in front of any HTTP backend,
//! described in one YAML file (its reference is the crate's README).
//!
//! [`config`] reads the file into typed Rust and names every problem
//! (file, line, column, field); the binary's `check FILE` runs it.
//! [`serve`] builds the routes from it (the library's layers over our own
//! forwarding) and serves them: `norepeat-gateway --config FILE
//! [--listen ADDR]` prints `listening on http://HOST:PORT` once ready.
//!
//! ```
//! use norepeat_gateway::config::Config;
//!
//! let config = Config::parse("gateway.yaml", b"
//! upstream: http://127.0.0.1:9000
//! routes:
//!   - match: POST /orders
//!     guard: token
//! ")?;
//! assert_eq!(config.routes.len(), 1);
//! assert_eq!(config.upstream.as_str(), "http://127.0.0.1:9000");
//! # Ok::<(), norepeat_gateway::config::Problems>(())
//! ```
//!
//! # The YAML crate
//!
//! The file is read with [`saphyr`] (0.3, the YAML 1.2 parser that
//! continues yaml-rust and yaml-rust2, released on crates.io and
//! maintained by the saphyr-rs organisation): its `MarkedYaml` tree puts a
//! line and column on every node, so a problem found after parsing still
//! names its line. `serde_yaml` is deprecated; `yaml_serde` (its fork) and
//! `serde-saphyr` deserialize through serde, which stops at the first
//! error, and `check` must name every problem at once. So the walk over
//! the tree is ours ([`config`]), and it refuses every unknown field, as
//! serde's `deny_unknown_fields` would.

pub mod config;
mod jwt;
pub mod serve;
pub mod throttle;
