//! Rate limiting: fixed window, sliding window and GCRA, on any store.

pub mod algorithm;
