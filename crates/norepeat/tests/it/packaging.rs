//! What a team reads before depending on the crate holds: the minimum Rust
//! version is true of every dependency (and is what sqlx needs, 1.88
//! without it), the docs list every feature, each feature pulls only its own
//! backend, and the published packages carry their licence texts and
//! README. Read from `cargo metadata`, `cargo tree` and `cargo package
//! --list`, so a new dependency or a feature change is checked as it lands.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::process::Command;

/// The crates we publish.
const PUBLISHED: [&str; 2] = ["norepeat", "norepeat-macros"];

fn cargo(args: &[&str]) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `"1.85"` or `"1.85.0"` as comparable numbers.
fn version(v: &str) -> (u64, u64, u64) {
    let mut parts = v.split('.').map(|p| p.parse::<u64>().unwrap());
    let major = parts.next().unwrap();
    (major, parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// Every package (`name version`) that a published crate needs to build,
/// with the features it is built with here (all of ours): normal and build
/// dependencies, not dev-dependencies, resolved for these crates alone.
fn dependencies(features: &[&str]) -> Vec<String> {
    let mut args = vec![
        "tree",
        "-e",
        "normal,build",
        "--prefix",
        "none",
        "--format",
        "{p}",
    ];
    for p in PUBLISHED {
        args.extend(["-p", p]);
    }
    args.extend_from_slice(features);
    let mut deps: Vec<String> = cargo(&args)
        .lines()
        .filter_map(|l| {
            // "name v1.2.3" or "name v1.2.3 (/path)" or with " (*)".
            let mut words = l.split_whitespace();
            let name = words.next()?;
            let v = words.next()?.strip_prefix('v')?;
            Some(format!("{name} {v}"))
        })
        .collect();
    deps.sort();
    deps.dedup();
    deps
}

#[test]
fn no_dependency_needs_a_newer_rust_than_we_declare() {
    let meta: serde_json::Value = serde_json::from_str(&cargo(&[
        "metadata",
        "--format-version",
        "1",
        "--all-features",
    ]))
    .unwrap();
    let packages = meta["packages"].as_array().unwrap();
    let rust_version: BTreeMap<String, Option<String>> = packages
        .iter()
        .map(|p| {
            let key = format!(
                "{} {}",
                p["name"].as_str().unwrap(),
                p["version"].as_str().unwrap()
            );
            (key, p["rust_version"].as_str().map(str::to_owned))
        })
        .collect();
    let ours = packages
        .iter()
        .find(|p| p["name"] == "norepeat")
        .and_then(|p| p["rust_version"].as_str())
        .expect("norepeat declares a rust-version");
    for p in PUBLISHED {
        let declared = packages.iter().find(|q| q["name"] == p).unwrap()["rust_version"].as_str();
        assert_eq!(
            declared,
            Some(ours),
            "{p} declares the workspace's rust-version"
        );
    }

    let deps = dependencies(&["--all-features"]);
    assert!(deps.len() > 50, "the tree was read: {deps:?}");
    let newer: Vec<String> = deps
        .iter()
        .filter_map(|d| {
            let theirs = rust_version.get(d).cloned().flatten()?;
            (version(&theirs) > version(ours)).then(|| format!("{d} needs Rust {theirs}"))
        })
        .collect();
    assert!(
        newer.is_empty(),
        "rust-version = \"{ours}\" is not true; raise it to the highest of:\n{}",
        newer.join("\n")
    );

    // And no lower: the crate docs and the README say 1.94 is what sqlx 0.9
    // needs, and that without the SQL features the dependencies need 1.88.
    let highest = |deps: &[String]| {
        let mut needs: Vec<(String, &String)> = deps
            .iter()
            .filter(|d| !PUBLISHED.contains(&d.split(' ').next().unwrap()))
            .filter_map(|d| Some((rust_version.get(d).cloned().flatten()?, d)))
            .collect();
        needs.sort_by_key(|(v, _)| version(v));
        let top = needs
            .last()
            .expect("some dependency declares a rust-version")
            .0
            .clone();
        let by: Vec<String> = needs
            .iter()
            .filter(|(v, _)| version(v) == version(&top))
            .map(|(_, d)| (*d).clone())
            .collect();
        (top, by)
    };
    let (top, by) = highest(&deps);
    assert_eq!(
        version(&top),
        version(ours),
        "with every feature the dependencies need Rust {top} ({by:?}), not {ours}"
    );
    assert!(
        by.iter().any(|d| d.starts_with("sqlx")),
        "Rust {top} is needed by {by:?}, not by sqlx as the docs say"
    );
    let (top, by) = highest(&dependencies(&[]));
    assert_eq!(
        version(&top),
        version("1.88"),
        "without the SQL features the dependencies need Rust {top} ({by:?}), not 1.88 as the docs say"
    );
}

/// The feature names of the table under `# Features` in the crate docs
/// (the first cell of each row, between backticks), and the ones whose
/// default column says **on**.
fn documented_features() -> (Vec<String>, Vec<String>) {
    let lib = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/lib.rs")).unwrap();
    let section = lib
        .split_once("//! # Features")
        .expect("the crate docs have a Features section")
        .1;
    let (mut all, mut on) = (Vec::new(), Vec::new());
    for row in section
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("//!"))
        .filter_map(|l| l.strip_prefix("//! | `"))
    {
        let (name, rest) = row.split_once('`').unwrap();
        all.push(name.to_owned());
        if rest.split('|').nth(1).is_some_and(|c| c.trim() == "**on**") {
            on.push(name.to_owned());
        }
    }
    (all, on)
}

/// The crate docs' table says it "lists every feature of this version", and
/// the crate's README names them on its `[dependencies]` line: both are
/// `Cargo.toml`'s `[features]`, with the same default.
#[test]
fn the_crate_docs_list_every_feature() {
    let meta: serde_json::Value =
        serde_json::from_str(&cargo(&["metadata", "--format-version", "1", "--no-deps"])).unwrap();
    let package = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "norepeat")
        .unwrap();
    let features = package["features"].as_object().unwrap();
    let mut declared: Vec<String> = features
        .keys()
        .filter(|k| *k != "default")
        .cloned()
        .collect();
    declared.sort();
    let mut default: Vec<String> = features["default"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_owned())
        .collect();
    default.sort();

    let (mut all, mut on) = documented_features();
    all.sort();
    on.sort();
    assert_eq!(
        all, declared,
        "the crate docs' Features table against Cargo.toml"
    );
    assert_eq!(
        on, default,
        "the features the table marks **on** against Cargo.toml's default"
    );

    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let line = readme
        .lines()
        .find_map(|l| l.split_once("# features: ").map(|(_, f)| f.to_owned()))
        .expect("the README's dependency line names the features");
    let mut named: Vec<String> = Vec::new();
    let mut named_default: Vec<String> = Vec::new();
    for f in line.split(", ") {
        match f.strip_suffix(" (default)") {
            Some(name) => {
                named.push(name.to_owned());
                named_default.push(name.to_owned());
            }
            None => named.push(f.to_owned()),
        }
    }
    named.sort();
    named_default.sort();
    assert_eq!(
        named, declared,
        "crates/norepeat/README.md's features line against Cargo.toml"
    );
    assert_eq!(
        named_default, default,
        "the README's (default) against Cargo.toml's default"
    );
}

#[test]
fn each_feature_pulls_only_its_own_backend() {
    let tree = |features: &[&str]| {
        let mut args = vec![
            "tree", "-p", "norepeat", "-e", "normal", "--prefix", "none", "--format", "{p}",
        ];
        args.extend_from_slice(features);
        cargo(&args)
    };
    let has = |tree: &str, name: &str| {
        tree.lines()
            .any(|l| l.split_whitespace().next() == Some(name))
    };

    let none = tree(&["--no-default-features"]);
    for absent in ["redis", "sqlx", "libsqlite3-sys", "sqlx-postgres"] {
        assert!(!has(&none, absent), "no features, yet {absent}:\n{none}");
    }
    let postgres = tree(&["--no-default-features", "--features", "postgres"]);
    assert!(has(&postgres, "sqlx-postgres"));
    for absent in ["libsqlite3-sys", "sqlx-sqlite", "redis"] {
        assert!(
            !has(&postgres, absent),
            "`postgres` alone pulls {absent}:\n{postgres}"
        );
    }
    let sqlite = tree(&["--no-default-features", "--features", "sqlite"]);
    assert!(has(&sqlite, "libsqlite3-sys"));
    for absent in ["sqlx-postgres", "redis"] {
        assert!(
            !has(&sqlite, absent),
            "`sqlite` alone pulls {absent}:\n{sqlite}"
        );
    }
    let redis = tree(&[]);
    assert!(has(&redis, "redis"));
    assert!(
        !has(&redis, "sqlx"),
        "the default features pull sqlx:\n{redis}"
    );
}

#[test]
fn published_packages_carry_their_licences_and_readme() {
    for p in PUBLISHED {
        let list = cargo(&["package", "--list", "--allow-dirty", "-p", p]);
        for file in ["LICENSE-MIT", "LICENSE-APACHE", "README.md", "Cargo.toml"] {
            assert!(
                list.lines().any(|l| l == file),
                "{p}'s package lacks {file}:\n{list}"
            );
        }
    }
    let meta: serde_json::Value =
        serde_json::from_str(&cargo(&["metadata", "--format-version", "1", "--no-deps"])).unwrap();
    for p in meta["packages"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let published = p["publish"].is_null(); // null: any registry
        assert_eq!(published, PUBLISHED.contains(&name), "{name}: publish");
        if published {
            assert_eq!(p["license"], "MIT OR Apache-2.0", "{name}");
            assert!(
                p["repository"].is_null(),
                "{name} names a repository: there is none yet"
            );
            assert!(
                !p["keywords"].as_array().unwrap().is_empty(),
                "{name}: keywords"
            );
            assert!(
                !p["categories"].as_array().unwrap().is_empty(),
                "{name}: categories"
            );
            assert!(p["description"].is_string(), "{name}: description");
        }
    }
}

#[test]
fn the_readme_sql_snippet_is_the_runnable_example() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/sql_store.rs"
    ))
    .unwrap();
    let start = readme
        .find("```rust\n/// The effect and the completed record")
        .unwrap()
        + 8;
    let snippet = &readme[start..start + readme[start..].find("```").unwrap()];
    assert!(snippet.lines().count() > 10, "{snippet}");
    assert!(
        example.contains(snippet),
        "the README's handler differs from examples/sql_store.rs (which is compiled and run):\n{snippet}"
    );
}
