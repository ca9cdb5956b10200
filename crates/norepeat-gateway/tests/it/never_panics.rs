//! No input, however malformed, panics the parser: it answers a config or
//! problems, and every problem has a message.

use norepeat_gateway::config::{Config, Problems};
use proptest::prelude::*;

const EXAMPLE: &[u8] = include_bytes!("../../examples/gateway.yaml");

fn answers(bytes: &[u8]) {
    match Config::parse("fuzz.yaml", bytes) {
        Ok(c) => assert!(c.routes.len() <= bytes.len()),
        Err(p) => well_formed(&p),
    }
}

fn well_formed(p: &Problems) {
    assert!(!p.list().is_empty());
    for problem in p.list() {
        assert!(!problem.message.is_empty());
    }
    assert_eq!(p.to_string().lines().count(), p.list().len());
}

proptest! {
    #[test]
    fn random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        answers(&bytes);
    }

    /// Text close to YAML, so the walk past the parser is reached too.
    #[test]
    fn yaml_like_text(text in "([a-z_]{1,12}: ?[-a-zA-Z0-9/{}:.,\\[\\] ]{0,16}\n( {2,4}- ?)?){0,12}") {
        answers(text.as_bytes());
    }

    /// The walk-through's example with bytes replaced, removed or inserted.
    #[test]
    fn mutated_example(
        edits in proptest::collection::vec((0..EXAMPLE.len(), any::<u8>(), 0..3u8), 1..8)
    ) {
        let mut bytes = EXAMPLE.to_vec();
        for (at, byte, how) in edits {
            let at = at.min(bytes.len().saturating_sub(1));
            match how {
                0 => bytes[at] = byte,
                1 => { bytes.remove(at); }
                _ => bytes.insert(at, byte),
            }
        }
        answers(&bytes);
    }
}

#[test]
fn the_example_parses() {
    let config = Config::parse("gateway.yaml", EXAMPLE).expect("examples/gateway.yaml");
    assert_eq!(config.routes.len(), 5);
}

#[test]
fn deep_nesting_is_refused_not_a_crash() {
    // A few hundred levels: far past any sensible file, still answered.
    let deep = format!("upstream: {}{}\n", "[".repeat(300), "]".repeat(300));
    let p = Config::parse("deep.yaml", deep.as_bytes()).expect_err("a list is no upstream");
    well_formed(&p);
}
