//! The duration grammar of `#[norepeat::guard]` (`window = "3s"`,
//! `retention`, `lease`, `wait`), written once.
//!
//! This one file is compiled into two crates: into `norepeat-macros` (as
//! `src/duration.rs`), which checks the attribute's literals when it
//! expands, and into `norepeat` (through the symlink
//! `src/attribute/duration.rs`), behind `norepeat::attribute::parse_duration`.
//! Neither crate can call the other here: the library depends on the
//! macros, and a proc-macro crate exports nothing but macros. So the file
//! uses `std` alone and nothing of either crate. It lives in the macros
//! crate, the lower of the two; `cargo package` copies the symlink's target
//! into the library's package, which so builds on its own.
//!
//! The grammar: a whole number (ASCII digits) and a unit, `ms`, `s`, `m`
//! (or `min`), `h` or `d`, with any whitespace around either. The duration
//! in milliseconds must fit a `u64` and be longer than zero.

/// Why a string is not a duration of the grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DurationError {
    /// Not a whole number and a unit, or more milliseconds than a `u64`
    /// holds.
    Invalid,
    /// A well-formed zero, such as `"0s"`: a guard needs a time to hold a
    /// key.
    Zero,
}

/// The units and their lengths in milliseconds.
const UNITS: [(&str, u64); 6] = [
    ("ms", 1),
    ("s", 1_000),
    ("m", 60_000),
    ("min", 60_000),
    ("h", 3_600_000),
    ("d", 86_400_000),
];

/// Parses `s` as a duration in whole milliseconds.
pub(crate) fn parse_ms(s: &str) -> Result<u64, DurationError> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit())
        .ok_or(DurationError::Invalid)?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| DurationError::Invalid)?;
    let unit = unit.trim();
    let (_, factor) = UNITS
        .iter()
        .find(|(name, _)| *name == unit)
        .ok_or(DurationError::Invalid)?;
    match n.checked_mul(*factor) {
        None => Err(DurationError::Invalid),
        Some(0) => Err(DurationError::Zero),
        Some(ms) => Ok(ms),
    }
}

/// What the grammar makes of these strings; each crate's tests run its
/// own side (the macro's literal check, `parse_duration`) over the table,
/// so both sides are seen to accept the same strings.
#[cfg(test)]
pub(crate) const CASES: &[(&str, Result<u64, DurationError>)] = {
    use DurationError::{Invalid, Zero};
    &[
        ("500ms", Ok(500)),
        ("3s", Ok(3_000)),
        ("1m", Ok(60_000)),
        ("2min", Ok(120_000)),
        ("24h", Ok(86_400_000)),
        ("7d", Ok(604_800_000)),
        ("007s", Ok(7_000)),
        (" 3s ", Ok(3_000)),
        ("3 s", Ok(3_000)),
        ("\t3\ns\n", Ok(3_000)),
        ("18446744073709551615ms", Ok(u64::MAX)),
        ("18446744073709551s", Ok(18_446_744_073_709_551_000)),
        ("0s", Err(Zero)),
        ("0ms", Err(Zero)),
        ("000d", Err(Zero)),
        ("18446744073709551616ms", Err(Invalid)),
        ("18446744073709552s", Err(Invalid)),
        ("3 parsecs", Err(Invalid)),
        ("3", Err(Invalid)),
        ("s", Err(Invalid)),
        ("", Err(Invalid)),
        ("   ", Err(Invalid)),
        ("-3s", Err(Invalid)),
        ("+3s", Err(Invalid)),
        ("3.5s", Err(Invalid)),
        ("1_000ms", Err(Invalid)),
        ("3S", Err(Invalid)),
        ("3sec", Err(Invalid)),
        ("3mins", Err(Invalid)),
        ("3 s s", Err(Invalid)),
        ("1m30s", Err(Invalid)),
        ("\u{663}s", Err(Invalid)),
        ("3\u{ff53}", Err(Invalid)),
    ]
};

/// Every string of up to four characters over digits, the units'
/// letters, near misses and whitespace: few enough to try all (31 thousand),
/// varied enough to meet every rule of the grammar. Both crates' tests run
/// their side over them too.
#[cfg(test)]
pub(crate) fn short_strings() -> Vec<String> {
    const ALPHABET: [char; 13] = [
        '0', '1', '9', ' ', '\t', 'm', 's', 'i', 'n', 'h', 'd', 'x', '-',
    ];
    let mut all = vec![String::new()];
    let mut longest = vec![String::new()];
    for _ in 0..4 {
        longest = longest
            .iter()
            .flat_map(|s| ALPHABET.iter().map(move |c| format!("{s}{c}")))
            .collect();
        all.extend(longest.iter().cloned());
    }
    all
}

#[cfg(test)]
mod tests {
    use super::{CASES, DurationError, UNITS, parse_ms, short_strings};

    #[test]
    fn the_table_holds() {
        for (s, want) in CASES {
            assert_eq!(parse_ms(s), *want, "{s:?}");
        }
    }

    /// A number in a unit, padded or not, is that many units, or invalid
    /// when the milliseconds overflow, or zero.
    #[test]
    fn a_number_and_a_unit_are_that_many_units() {
        for (unit, factor) in UNITS {
            let edge = u64::MAX / factor;
            for n in [
                0,
                1,
                2,
                7,
                59,
                60,
                999,
                1_000,
                86_400,
                edge - 1,
                edge,
                edge.saturating_add(1),
                u64::MAX,
            ] {
                let want = match n.checked_mul(factor) {
                    None => Err(DurationError::Invalid),
                    Some(0) => Err(DurationError::Zero),
                    Some(ms) => Ok(ms),
                };
                for (a, b, c) in [
                    ("", "", ""),
                    (" ", "", " "),
                    ("", " ", ""),
                    ("\t", "  ", "\n"),
                ] {
                    let s = format!("{a}{n}{b}{unit}{c}");
                    assert_eq!(parse_ms(&s), want, "{s:?}");
                }
            }
        }
    }

    /// What the grammar accepts is digits and a unit: it starts with a
    /// digit and ends in a unit once trimmed, and parses the same trimmed.
    #[test]
    fn what_is_accepted_is_digits_and_a_unit() {
        let mut accepted = 0;
        for s in short_strings() {
            if let Ok(ms) = parse_ms(&s) {
                accepted += 1;
                let trimmed = s.trim();
                assert!(trimmed.starts_with(|c: char| c.is_ascii_digit()), "{s:?}");
                assert!(
                    UNITS.iter().any(|(name, _)| trimmed.ends_with(name)),
                    "{s:?}"
                );
                assert_eq!(parse_ms(trimmed), Ok(ms), "{s:?}");
            }
        }
        // "1s", " 9ms", "10m", "1min" and the rest: the walk meets them.
        assert!(accepted > 500, "{accepted}");
    }
}
