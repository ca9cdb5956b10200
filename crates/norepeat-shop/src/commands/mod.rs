//! The binary's commands.

pub mod serve;
