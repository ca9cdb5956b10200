//! Wrong arguments to `#[norepeat::guard]` are compile errors that point at
//! the offending token.

#[test]
fn wrong_arguments_are_compile_errors() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
