//! The binary's commands.

pub mod bench;
pub mod serve;
pub mod storm;
