//! HTTP is a one-way edge: only the layers (`layer.rs` files) and their
//! shared skeleton (`middleware.rs`) speak [`Problem`](crate::problem::Problem);
//! the cores (guards, limiters, verifiers, stores) say what they refused in
//! their own error types, and `problem.rs` knows none of them. These tests
//! read the sources, so a stray import fails the build's tests rather than
//! a review.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("the crate's sources are readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The lines of `text` that are code, not comments or docs.
fn code(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter(|l| !l.trim_start().starts_with("//"))
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn only_layers_and_the_skeleton_use_problem() {
    // Spelled in two pieces so that this file does not name it itself.
    let needle = ["crate::", "problem"].concat();
    let src = src();
    let mut files = Vec::new();
    sources(&src, &mut files);
    assert!(
        files.iter().any(|f| f.ends_with("problem.rs")) && files.len() > 40,
        "read {} files, not the crate's sources",
        files.len()
    );
    let mut users = Vec::new();
    let mut offenders = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("a source file is UTF-8");
        if !code(&text).any(|l| l.contains(&needle)) {
            continue;
        }
        let rel = file.strip_prefix(&src).expect("under src").to_path_buf();
        let allowed = rel.ends_with("layer.rs") || rel == Path::new("middleware.rs");
        if allowed {
            users.push(rel);
        } else {
            offenders.push(rel);
        }
    }
    assert!(
        offenders.is_empty(),
        "only layer.rs files and middleware.rs may use {needle}; also: {offenders:?}"
    );
    // The five layers and the skeleton answer with problems.
    assert_eq!(users.len(), 6, "{users:?}");
}

#[test]
fn problem_imports_nothing_from_the_crate() {
    let text = std::fs::read_to_string(src().join("problem.rs")).expect("problem.rs");
    assert!(text.contains("pub struct Problem"), "read problem.rs");
    let imports: Vec<&str> = code(&text).filter(|l| l.contains("crate::")).collect();
    assert!(imports.is_empty(), "problem.rs uses the crate: {imports:?}");
}
