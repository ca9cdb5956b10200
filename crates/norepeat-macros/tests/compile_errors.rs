//! Wrong arguments to `#[norepeat::guard]` are compile errors that point at
//! the offending token, with no misleading warning after them; right ones
//! compile without a warning, even under `#![deny(warnings)]`.

#[test]
fn wrong_arguments_are_compile_errors() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
    t.pass("tests/pass/*.rs");
}
