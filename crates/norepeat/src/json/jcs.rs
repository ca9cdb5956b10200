// Over 400 lines on purpose: one strict JSON reader and its canonical writer (RFC 8259, RFC 8785), with the table of inputs each rule refuses.
//! A strict JSON reader (RFC 8259) that writes RFC 8785 (JCS) text.
//! (Over 400 lines on purpose: one strict reader and the ECMAScript number form it writes, which read best whole.)
//!
//! Reading it here, rather than through `serde_json::Value`, is what lets the
//! canonical form see what a `Value` hides: a key given twice (an error here,
//! "the last one wins" there) and the exact text of a number (a `Value`
//! rounds an integer beyond 64 bits through `f64`).

use super::InvalidJson;
use std::borrow::Cow;

/// Deepest nesting read (as `serde_json`'s default limit).
const MAX_DEPTH: usize = 128;

/// A parsed value, ignored fields already dropped. Strings without escapes
/// and numbers already in canonical form borrow the body's text.
pub(super) enum Value<'a> {
    Null,
    Bool(bool),
    /// The canonical text of the number.
    Number(Cow<'a, str>),
    String(Cow<'a, str>),
    Array(Vec<Value<'a>>),
    /// Members sorted by their keys' UTF-16 code units.
    Object(Vec<(Cow<'a, str>, Value<'a>)>),
}

impl Value<'_> {
    /// Appends the RFC 8785 text of the value.
    pub(super) fn write(&self, out: &mut Vec<u8>) {
        match self {
            Value::Null => out.extend_from_slice(b"null"),
            Value::Bool(true) => out.extend_from_slice(b"true"),
            Value::Bool(false) => out.extend_from_slice(b"false"),
            Value::Number(n) => out.extend_from_slice(n.as_bytes()),
            Value::String(s) => write_string(s, out),
            Value::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.write(out);
                }
                out.push(b']');
            }
            Value::Object(members) => {
                out.push(b'{');
                for (i, (k, v)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_string(k, out);
                    out.push(b':');
                    v.write(out);
                }
                out.push(b'}');
            }
        }
    }
}

/// A string as ECMAScript's `JSON.stringify` writes it (RFC 8785 3.2.2.2):
/// `"` and `\` escaped, the C0 controls as `\b \t \n \f \r` or `\u00xx`,
/// everything else as itself.
fn write_string(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    // Runs without a byte to escape are copied whole.
    let plain = |b: &u8| *b != b'"' && *b != b'\\' && *b >= 0x20;
    if s.as_bytes().iter().all(plain) {
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
        return;
    }
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\u{8}' => out.extend_from_slice(b"\\b"),
            '\t' => out.extend_from_slice(b"\\t"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\u{c}' => out.extend_from_slice(b"\\f"),
            '\r' => out.extend_from_slice(b"\\r"),
            c if (c as u32) < 0x20 => {
                out.extend_from_slice(format!("\\u{:04x}", c as u32).as_bytes());
            }
            c => {
                let mut buf = [0; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out.push(b'"');
}

pub(super) struct Parser<'a> {
    pub(super) s: &'a [u8],
    pub(super) text: &'a str,
    pub(super) pos: usize,
    pub(super) ignored: &'a [Box<str>],
}

fn err(what: &str, pos: usize) -> InvalidJson {
    InvalidJson(format!("{what} at byte {pos}"))
}

impl<'a> Parser<'a> {
    /// One value and nothing but whitespace around it.
    pub(super) fn document(&mut self) -> Result<Value<'a>, InvalidJson> {
        let v = self.value(0)?;
        self.ws();
        if self.pos != self.s.len() {
            return Err(err("trailing characters", self.pos));
        }
        Ok(v)
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.s.get(self.pos) {
            self.pos += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn expect(&mut self, b: u8) -> Result<(), InvalidJson> {
        if self.peek() == Some(b) {
            self.pos += 1;
            Ok(())
        } else {
            Err(err(&format!("expected `{}`", b as char), self.pos))
        }
    }

    fn literal(&mut self, word: &[u8], v: Value<'a>) -> Result<Value<'a>, InvalidJson> {
        if self.s[self.pos..].starts_with(word) {
            self.pos += word.len();
            Ok(v)
        } else {
            Err(err("expected a value", self.pos))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value<'a>, InvalidJson> {
        self.ws();
        match self.peek() {
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => self.string().map(Value::String),
            Some(b't') => self.literal(b"true", Value::Bool(true)),
            Some(b'f') => self.literal(b"false", Value::Bool(false)),
            Some(b'n') => self.literal(b"null", Value::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => Err(err("expected a value", self.pos)),
            None => Err(err("unexpected end", self.pos)),
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value<'a>, InvalidJson> {
        if depth > MAX_DEPTH {
            return Err(err("nested too deep", self.pos));
        }
        self.pos += 1;
        let mut items = Vec::new();
        self.ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Value::Array(items));
        }
        loop {
            items.push(self.value(depth)?);
            self.ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Value::Array(items));
                }
                _ => return Err(err("expected `,` or `]`", self.pos)),
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value<'a>, InvalidJson> {
        if depth > MAX_DEPTH {
            return Err(err("nested too deep", self.pos));
        }
        self.pos += 1;
        // Every key, ignored ones included: a duplicate is an error wherever.
        let mut members: Vec<(Cow<'a, str>, Option<Value<'a>>)> = Vec::new();
        self.ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
        } else {
            loop {
                self.ws();
                if self.peek() != Some(b'"') {
                    return Err(err("expected a key", self.pos));
                }
                let key = self.string()?;
                self.ws();
                self.expect(b':')?;
                let v = self.value(depth)?;
                let keep = !self.ignored.iter().any(|f| **f == *key);
                members.push((key, keep.then_some(v)));
                self.ws();
                match self.peek() {
                    Some(b',') => self.pos += 1,
                    Some(b'}') => {
                        self.pos += 1;
                        break;
                    }
                    _ => return Err(err("expected `,` or `}`", self.pos)),
                }
            }
        }
        members.sort_by(|a, b| utf16_order(&a.0, &b.0));
        if let Some(w) = members.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(InvalidJson(format!("duplicate key {:?}", w[0].0)));
        }
        Ok(Value::Object(
            members
                .into_iter()
                .filter_map(|(k, v)| v.map(|v| (k, v)))
                .collect(),
        ))
    }

    fn hex4(&mut self) -> Result<u32, InvalidJson> {
        let digits = self
            .text
            .get(self.pos..self.pos + 4)
            .filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| err("bad \\u escape", self.pos))?;
        self.pos += 4;
        u32::from_str_radix(digits, 16).map_err(|_| err("bad \\u escape", self.pos))
    }

    fn string(&mut self) -> Result<Cow<'a, str>, InvalidJson> {
        self.pos += 1; // the opening quote
        // Without an escape, the string is the body's own text.
        let start = self.pos;
        while let Some(b) = self.peek() {
            if b == b'"' || b == b'\\' || b < 0x20 {
                break;
            }
            self.pos += 1;
        }
        if self.peek() == Some(b'"') {
            self.pos += 1;
            // Stops only at ASCII bytes, so on a char boundary.
            return Ok(Cow::Borrowed(&self.text[start..self.pos - 1]));
        }
        self.pos = start;
        let mut out = String::new();
        loop {
            let start = self.pos;
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            // Stops only at ASCII bytes, so on a char boundary.
            out.push_str(&self.text[start..self.pos]);
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(Cow::Owned(out));
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let c = match self.peek() {
                        Some(b'"') => '"',
                        Some(b'\\') => '\\',
                        Some(b'/') => '/',
                        Some(b'b') => '\u{8}',
                        Some(b'f') => '\u{c}',
                        Some(b'n') => '\n',
                        Some(b'r') => '\r',
                        Some(b't') => '\t',
                        Some(b'u') => {
                            self.pos += 1;
                            let at = self.pos;
                            let hi = self.hex4()?;
                            let code = if (0xD800..0xDC00).contains(&hi) {
                                if !self.s[self.pos..].starts_with(b"\\u") {
                                    return Err(err("lone surrogate", at));
                                }
                                self.pos += 2;
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return Err(err("lone surrogate", at));
                                }
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            } else {
                                hi
                            };
                            out.push(
                                char::from_u32(code).ok_or_else(|| err("lone surrogate", at))?,
                            );
                            continue;
                        }
                        _ => return Err(err("bad escape", self.pos)),
                    };
                    self.pos += 1;
                    out.push(c);
                }
                Some(_) => return Err(err("control character in a string", self.pos)),
                None => return Err(err("unterminated string", self.pos)),
            }
        }
    }

    fn number(&mut self) -> Result<Value<'a>, InvalidJson> {
        let start = self.pos;
        let digits = |p: &mut Self| {
            let from = p.pos;
            while p.peek().is_some_and(|b| b.is_ascii_digit()) {
                p.pos += 1;
            }
            p.pos - from
        };
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                digits(self);
            }
            _ => return Err(err("bad number", self.pos)),
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if digits(self) == 0 {
                return Err(err("bad number", self.pos));
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            if digits(self) == 0 {
                return Err(err("bad number", self.pos));
            }
        }
        Ok(Value::Number(canonical_number(&self.text[start..self.pos])))
    }
}

/// RFC 8785's order of keys: by UTF-16 code units. Two ASCII keys compare
/// as their bytes do.
fn utf16_order(a: &str, b: &str) -> std::cmp::Ordering {
    if a.is_ascii() && b.is_ascii() {
        a.cmp(b)
    } else {
        a.encode_utf16().cmp(b.encode_utf16())
    }
}

/// A decimal number as `(negative, digits, exponent)`: the value is
/// `digits × 10^exponent`, `digits` without leading or trailing zeros
/// (empty for zero).
#[derive(Debug, PartialEq, Eq)]
struct Decimal {
    negative: bool,
    digits: String,
    exponent: i64,
}

/// Reads a number literal (JSON's grammar, or `ryu`'s output).
fn decimal(text: &str) -> Decimal {
    let (negative, rest) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text),
    };
    let (mantissa, exp) = match rest.find(['e', 'E']) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, "0"),
    };
    // Saturates: a body is at most a few MiB, so an exponent this far out
    // is beyond any precision the digits could carry either way.
    let exp: i64 = exp
        .trim_start_matches('+')
        .parse()
        .unwrap_or(if exp.starts_with('-') {
            -(1 << 40)
        } else {
            1 << 40
        });
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let mut digits = String::with_capacity(int.len() + frac.len());
    for part in [int, frac] {
        digits.push_str(if digits.is_empty() {
            part.trim_start_matches('0')
        } else {
            part
        });
    }
    let kept = digits.trim_end_matches('0').len();
    let trailing = (digits.len() - kept) as i64;
    digits.truncate(kept);
    Decimal {
        negative,
        digits,
        exponent: exp - frac.len() as i64 + trailing,
    }
}

/// The canonical text of a JSON number literal.
///
/// A number with a fractional part is the double it denotes, in ECMAScript
/// form (RFC 8785 3.2.2.3): `0.10000000000000001`, as a `%.17g` serialiser
/// writes `0.1`, is `0.1`. An integer is too when its double holds it
/// exactly (the literal is that double's shortest form, up to notation:
/// `1e30`, `100`, `1.0`); an integer a double cannot hold (beyond 2^53 with
/// more digits than a double keeps, or out of range) is written exactly, in
/// the same layout, instead of collapsing into its neighbours. That text is
/// never the shortest form of any double (it would have parsed to it), so
/// the two kinds cannot meet.
fn canonical_number(text: &str) -> Cow<'_, str> {
    // A plain integer of at most 15 digits is its own canonical form: a
    // double holds it exactly, and JSON's grammar allows no leading zero.
    let magnitude = text.strip_prefix('-').unwrap_or(text);
    if magnitude.len() <= SURE_DIGITS && magnitude.bytes().all(|b| b.is_ascii_digit()) {
        return Cow::Borrowed(if magnitude == "0" { "0" } else { text });
    }
    let exact = decimal(text);
    if exact.digits.is_empty() {
        return Cow::Borrowed("0"); // -0 too, as ECMAScript writes it.
    }
    // At most 15 significant digits, well inside the normal doubles: the
    // double nearest the literal has these digits as its shortest form
    // (two such decimals never round to one double), so the literal's
    // digits are the double's.
    let n = exact.exponent + exact.digits.len() as i64;
    if exact.digits.len() <= SURE_DIGITS && (-290..=290).contains(&n) {
        return Cow::Owned(ecmascript(&exact));
    }
    Cow::Owned(canonical_number_slow(text, &exact))
}

/// Significant decimal digits every double keeps (`DBL_DIG`).
const SURE_DIGITS: usize = 15;

/// [`canonical_number`] through the double the literal denotes.
fn canonical_number_slow(text: &str, exact: &Decimal) -> String {
    let integer = exact.exponent >= 0;
    match text.parse::<f64>().ok().filter(|f| f.is_finite()) {
        Some(f) => {
            let mut buf = ryu::Buffer::new();
            let shortest = decimal(buf.format_finite(f));
            if shortest.digits.is_empty() {
                return "0".to_owned(); // underflow to zero, as a double
            }
            if !integer || shortest == *exact {
                ecmascript(&shortest)
            } else {
                ecmascript(exact)
            }
        }
        // Beyond a double's range: an integer is kept; a fraction this
        // large is an integer too (exponent >= 0), so only the tiny remain,
        // which `parse` gives as 0, finite, above.
        None => ecmascript(exact),
    }
}

/// ECMAScript's Number::toString layout (ECMA-262, Number::toString, steps
/// for radix 10) applied to a decimal's digits.
fn ecmascript(d: &Decimal) -> String {
    let k = d.digits.len() as i64;
    let n = d.exponent + k; // value = 0.digits × 10^n
    let mut s = String::with_capacity(d.digits.len() + 8);
    if d.negative {
        s.push('-');
    }
    if k <= n && n <= 21 {
        s.push_str(&d.digits);
        s.extend(std::iter::repeat_n('0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        let (a, b) = d.digits.split_at(n as usize);
        s.push_str(a);
        s.push('.');
        s.push_str(b);
    } else if -6 < n && n <= 0 {
        s.push_str("0.");
        s.extend(std::iter::repeat_n('0', (-n) as usize));
        s.push_str(&d.digits);
    } else {
        let (a, b) = d.digits.split_at(1);
        s.push_str(a);
        if !b.is_empty() {
            s.push('.');
            s.push_str(b);
        }
        s.push('e');
        s.push(if n - 1 < 0 { '-' } else { '+' });
        s.push_str(&(n - 1).unsigned_abs().to_string());
    }
    s
}

#[cfg(test)]
mod tests {
    /// The strict reader with no field ignored.
    struct Strict;
    impl Strict {
        fn canonicalize(&self, body: &[u8]) -> Result<Vec<u8>, super::InvalidJson> {
            super::super::canonicalize(body, &[])
        }
    }

    fn canon(json: &str) -> String {
        String::from_utf8(super::super::canonicalize(json.as_bytes(), &[]).expect(json))
            .expect("utf-8")
    }

    #[test]
    fn numbers_in_ecmascript_form() {
        // RFC 8785 appendix B (the finite ones) and the usual suspects.
        for (input, want) in [
            ("0", "0"),
            ("-0", "0"),
            ("-0.0e5", "0"),
            ("1", "1"),
            ("1.0", "1"),
            ("1e0", "1"),
            ("10E-1", "1"),
            ("100", "100"),
            ("1e2", "100"),
            ("0.1", "0.1"),
            ("-1.5", "-1.5"),
            ("1e21", "1e+21"),
            ("1e20", "100000000000000000000"),
            ("123456789012345680000", "123456789012345680000"),
            ("0.000001", "0.000001"),
            ("1e-7", "1e-7"),
            ("1.5e-7", "1.5e-7"),
            ("5e-324", "5e-324"),
            ("1.7976931348623157e308", "1.7976931348623157e+308"),
            ("9007199254740992", "9007199254740992"),
            ("333333333.33333329", "333333333.3333333"),
            ("4.50", "4.5"),
            ("2e-3", "0.002"),
            ("0.000001000", "0.000001"),
            ("0.10000000000000001", "0.1"),
            ("0.10000000000000000001", "0.1"),
            ("1e-400", "0"),
            ("9007199254740993.5", "9007199254740994"),
        ] {
            assert_eq!(canon(input), want, "{input}");
        }
    }

    #[test]
    fn numbers_beyond_a_double_are_kept_exactly() {
        for (input, want) in [
            ("9007199254740993", "9007199254740993"),
            ("-18446744073709551617", "-18446744073709551617"),
            ("1e400", "1e+400"),
            (
                "1234567890123456789012345",
                "1.234567890123456789012345e+24",
            ),
        ] {
            assert_eq!(canon(input), want, "{input}");
        }
    }

    #[test]
    fn rfc8785_example() {
        // RFC 8785, section 3.2.3 (the input with its numbers and strings).
        let input = r#"{
          "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
          "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
          "literals": [null, true, false]
        }"#;
        let want = "{\"literals\":[null,true,false],\"numbers\":[333333333.3333333,1e+30,4.5,0.002,1e-27],\"string\":\"€$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}";
        assert_eq!(canon(input), want);
    }

    #[test]
    fn keys_sort_by_utf16_code_units() {
        // RFC 8785 3.2.3's sorting example: U+1F600 (a surrogate pair,
        // 0xD83D...) sorts before U+FB33 in UTF-16, after it in UTF-8.
        let input = "{\"\u{20ac}\":\"Euro Sign\",\"\\r\":\"Carriage Return\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\",\"1\":\"One\",\"\u{1f600}\":\"Emoji: Grinning Face\",\"\u{80}\":\"Control\",\"\u{f6}\":\"Latin Small Letter O With Diaeresis\"}";
        let want = "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\"\u{f6}\":\"Latin Small Letter O With Diaeresis\",\"\u{20ac}\":\"Euro Sign\",\"\u{1f600}\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}";
        assert_eq!(canon(input), want);
    }

    #[test]
    fn strict_reading() {
        let fp = Strict;
        for bad in [
            "",
            " ",
            "{",
            "[1,]",
            "{\"a\":1,}",
            "01",
            "1.",
            ".5",
            "-",
            "1e",
            "+1",
            "NaN",
            "\"\\ud800\"",
            "\"\\udc00\"",
            "\"a\u{1}\"",
            "\"\\x\"",
            "[1] [2]",
            "tru",
            "{\"a\" 1}",
            "{1:2}",
        ] {
            assert!(fp.canonicalize(bad.as_bytes()).is_err(), "{bad:?}");
        }
        let deep = format!("{}{}", "[".repeat(129), "]".repeat(129));
        assert!(fp.canonicalize(deep.as_bytes()).is_err());
        let ok = format!("{}{}", "[".repeat(128), "]".repeat(128));
        assert!(fp.canonicalize(ok.as_bytes()).is_ok());
        assert!(fp.canonicalize(b"\"\\ud83d\\ude00\"").is_ok());
        assert!(fp.canonicalize(b"\xff").is_err());
    }

    proptest::proptest! {
        /// Every double: its canonical text is ECMAScript's shortest form,
        /// reads back as the same double, and is a fixed point. Its 17-digit
        /// rendering (what `%.17g` writes) canonicalises the same way when
        /// it is a fraction or an integer a double holds.
        #[test]
        fn doubles_round_trip(f in proptest::num::f64::NORMAL | proptest::num::f64::SUBNORMAL | proptest::num::f64::ZERO) {
            let plain = canon(&serde_json::to_string(&f).expect("finite"));
            proptest::prop_assert_eq!(plain.parse::<f64>().expect("a number"), f);
            proptest::prop_assert_eq!(&canon(&plain), &plain);
            // An integral double beyond 2^53 written with 17 digits is
            // another integer (kept exact, by design); any other is `plain`.
            if f.abs() < 9_007_199_254_740_992.0 {
                proptest::prop_assert_eq!(&canon(&format!("{f:.16e}")), &plain);
            }
        }

        /// The short ways to a number's canonical text (a plain integer of
        /// at most 15 digits, a literal of at most 15 significant digits)
        /// give what the way through the double gives, in every notation.
        #[test]
        fn short_numbers_take_the_same_form_either_way(
            digits in 1u64..1_000_000_000_000_000,
            shift in 0u32..16,
            exp in -320i32..320,
            negative in proptest::bool::ANY,
            notation in 0u8..4,
        ) {
            let d = digits.to_string();
            let sign = if negative { "-" } else { "" };
            let point = (shift as usize).min(d.len() - 1);
            let text = match notation {
                0 => format!("{sign}{d}"),
                1 => format!("{sign}{}.{}", &d[..d.len() - point], &d[d.len() - point..]),
                2 => format!("{sign}{d}e{exp}"),
                _ => format!("{sign}0.{}{d}E{exp:+}", "0".repeat(shift as usize)),
            };
            let slow = super::canonical_number_slow(&text, &super::decimal(&text));
            let fast = super::canonical_number(&text);
            proptest::prop_assert_eq!(fast.as_ref(), slow.as_str(), "{}", text);
        }

        /// Integers: every i64 and u64 canonicalises to a fixed point that
        /// reads back as a number equal to it where a double holds it, and
        /// two different integers never meet.
        #[test]
        fn integers_never_collide(a in proptest::num::u64::ANY, b in proptest::num::u64::ANY) {
            let (ca, cb) = (canon(&a.to_string()), canon(&b.to_string()));
            proptest::prop_assert_eq!(a == b, ca == cb);
            proptest::prop_assert_eq!(&canon(&ca), &ca);
            proptest::prop_assert_eq!(&canon(&format!("{a}.000")), &ca);
        }
    }
}
