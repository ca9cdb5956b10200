//! The YAML walker: a file's tree read field by field, each value by its
//! grammar, every problem recorded with its line, column and field (and
//! the nearest name for a misspelt one) instead of stopping at the first.
//! `parse.rs` says what the fields are; this is how any field is read.

use saphyr::{MarkedYaml, Scalar, YamlData};
use std::num::NonZeroU32;
use std::time::Duration;

use super::Problem;

pub(super) type Node<'a> = MarkedYaml<'a>;

/// A scalar's text, when it is a string (also an unresolved one).
pub(super) fn node_str<'a>(node: &'a Node) -> Option<&'a str> {
    match &node.data {
        YamlData::Value(Scalar::String(s)) => Some(s),
        YamlData::Representation(s, _, _) => Some(s),
        YamlData::Tagged(_, inner) => node_str(inner),
        _ => None,
    }
}

/// What a node is, for "expected X, found Y".
fn kind(node: &Node) -> &'static str {
    match &node.data {
        YamlData::Value(Scalar::Null) => "nothing",
        YamlData::Value(Scalar::Boolean(_)) => "a boolean",
        YamlData::Value(Scalar::Integer(_) | Scalar::FloatingPoint(_)) => "a number",
        YamlData::Value(Scalar::String(_)) | YamlData::Representation(..) => "a string",
        YamlData::Sequence(_) => "a list",
        YamlData::Mapping(_) => "a mapping",
        YamlData::Tagged(_, inner) => kind(inner),
        YamlData::Alias(_) => "an alias (aliases are not supported)",
        YamlData::BadValue => "a bad value",
    }
}

/// The fields of one mapping, by name.
pub(super) struct Fields<'a, 'n> {
    pub(super) entries: Vec<(&'a str, &'a Node<'n>)>,
}

impl<'a, 'n> Fields<'a, 'n> {
    pub(super) fn get(&self, name: &str) -> Option<&'a Node<'n>> {
        self.entries
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
    }
}

#[derive(Default)]
pub(super) struct Walker {
    pub(super) problems: Vec<Problem>,
}

impl Walker {
    /// Records a problem at `node`.
    pub(super) fn at(&mut self, node: &Node, field: &str, message: &str) {
        self.problems.push(Problem {
            line: Some(node.span.start.line()),
            column: Some(node.span.start.col() + 1),
            field: field.to_owned(),
            message: message.to_owned(),
        });
    }

    /// A mapping whose keys are all in `known`.
    pub(super) fn mapping<'a, 'n>(
        &mut self,
        node: &'a Node<'n>,
        path: &str,
        known: &[&str],
    ) -> Option<Fields<'a, 'n>> {
        let node = untag(node);
        let YamlData::Mapping(map) = &node.data else {
            let message = format!("expected a mapping of fields, found {}", kind(node));
            self.at(node, path, &message);
            return None;
        };
        // Unknown fields are recorded, and the known ones still read, so
        // their problems are found in the same run.
        let mut entries = Vec::new();
        for (k, v) in map {
            let field = |name: &str| {
                if path.is_empty() {
                    name.to_owned()
                } else {
                    format!("{path}.{name}")
                }
            };
            match node_str(k) {
                Some(name) if known.contains(&name) => entries.push((name, v)),
                Some(name) => {
                    let message = match known.iter().find(|k| edits(name, k) <= 2) {
                        Some(near) => format!("unknown field; did you mean {near}?"),
                        None => format!("unknown field; expected one of {}", known.join(", ")),
                    };
                    self.at(k, &field(name), &message);
                }
                None => {
                    self.at(
                        k,
                        path,
                        &format!("a field's name must be a string, found {}", kind(k)),
                    );
                }
            }
        }
        Some(Fields { entries })
    }

    pub(super) fn sequence<'a, 'n>(
        &mut self,
        node: &'a Node<'n>,
        path: &str,
    ) -> Option<&'a [Node<'n>]> {
        let node = untag(node);
        match &node.data {
            YamlData::Sequence(items) => Some(items),
            _ => {
                self.at(
                    node,
                    path,
                    &format!("expected a list, found {}", kind(node)),
                );
                None
            }
        }
    }

    /// A string scalar run through `f`, its error recorded.
    pub(super) fn parse<T>(
        &mut self,
        node: &Node,
        path: &str,
        f: impl FnOnce(&str) -> Result<T, String>,
    ) -> Option<T> {
        let Some(s) = node_str(node) else {
            self.at(
                node,
                path,
                &format!("expected a string, found {}", kind(node)),
            );
            return None;
        };
        match f(s) {
            Ok(v) => Some(v),
            Err(e) => {
                self.at(node, path, &e);
                None
            }
        }
    }

    pub(super) fn bool(&mut self, node: &Node, path: &str) -> Option<bool> {
        match &untag(node).data {
            YamlData::Value(Scalar::Boolean(b)) => Some(*b),
            _ => {
                self.at(
                    node,
                    path,
                    &format!("expected true or false, found {}", kind(node)),
                );
                None
            }
        }
    }

    pub(super) fn duration(&mut self, node: &Node, path: &str) -> Option<Duration> {
        if let YamlData::Value(Scalar::Integer(n)) = &untag(node).data {
            self.at(
                node,
                path,
                &format!("{n} has no unit; write a duration such as 250ms, 3s, 5m or 24h"),
            );
            return None;
        }
        self.parse(node, path, |s| {
            norepeat::attribute::parse_duration(s).ok_or_else(|| {
                format!("expected a duration above zero such as 250ms, 3s, 5m or 24h, not {s:?}")
            })
        })
    }

    pub(super) fn size(&mut self, node: &Node, path: &str) -> Option<u64> {
        match &untag(node).data {
            YamlData::Value(Scalar::Integer(n)) => match u64::try_from(*n) {
                Ok(n) if n > 0 => Some(n),
                _ => {
                    self.at(node, path, &format!("a size is above zero, not {n}"));
                    None
                }
            },
            _ => self.parse(node, path, parse_size),
        }
    }

    pub(super) fn count(&mut self, node: &Node, path: &str) -> Option<NonZeroU32> {
        let n = match &untag(node).data {
            YamlData::Value(Scalar::Integer(n)) => Some(*n),
            _ => None,
        };
        match n
            .and_then(|n| u32::try_from(n).ok())
            .and_then(NonZeroU32::new)
        {
            Some(n) => Some(n),
            None => {
                let found = n.map_or_else(|| kind(node).to_owned(), |n| n.to_string());
                self.at(
                    node,
                    path,
                    &format!("expected a whole number from 1 to 4294967295, found {found}"),
                );
                None
            }
        }
    }

    pub(super) fn strings(&mut self, node: &Node, path: &str) -> Option<Vec<String>> {
        let items = self.sequence(node, path)?;
        let mut all = Some(Vec::new());
        for (i, item) in items.iter().enumerate() {
            let s = self.parse(item, &format!("{path}[{i}]"), |s| {
                if s.is_empty() {
                    Err("an empty name".to_owned())
                } else {
                    Ok(s.to_owned())
                }
            });
            match (s, all.as_mut()) {
                (Some(s), Some(v)) => v.push(s),
                _ => all = None,
            }
        }
        all
    }
}

pub(super) fn untag<'a, 'n>(node: &'a Node<'n>) -> &'a Node<'n> {
    match &node.data {
        YamlData::Tagged(_, inner) => untag(inner),
        _ => node,
    }
}

/// The Levenshtein distance of two short names, for "did you mean".
pub(super) fn edits(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// A size: a whole number of bytes, or one with `B`, `KiB`, `MiB`, `GiB`.
pub(super) fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let factor = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => 0,
    };
    n.parse::<u64>()
        .ok()
        .filter(|_| factor != 0)
        .and_then(|n| n.checked_mul(factor))
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            format!("expected a size above zero such as 65536, 64KiB or 1MiB, not {s:?}")
        })
}
