//! The binary's commands.

pub mod serve;
pub mod storm;
