//! The `#[norepeat::guard]` attribute (see the `norepeat` crate).
