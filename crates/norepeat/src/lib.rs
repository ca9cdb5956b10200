//! norepeat
