//! Phase one: the attribute's options, `name = value` pairs parsed and
//! checked against one another (a mode's options only in that mode, `tx`
//! only with a store), before the function is looked at.

use crate::duration::{DurationError, parse_ms};
use proc_macro2::Span;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Expr, Ident, LitStr, Token};

const OPTIONS: &str =
    "store, key, mode, window, retention, lease, wait, scope, on_store_failure, abandoned, tx";

/// One `name = value` of the attribute.
enum Opt {
    Store(Ident, Expr),
    Str(Ident, LitStr),
    Word(Ident, Ident),
    /// `tx = name`: the binding the body uses for the transaction.
    Tx(Ident, Ident),
}

impl Opt {
    fn name(&self) -> &Ident {
        match self {
            Opt::Store(n, _) | Opt::Str(n, _) | Opt::Word(n, _) | Opt::Tx(n, _) => n,
        }
    }
}

impl Parse for Opt {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let name: Ident = input.parse()?;
        let n = name.to_string();
        if !OPTIONS.split(", ").any(|o| o == n) {
            return Err(syn::Error::new(
                name.span(),
                format!("unknown option `{n}` of #[norepeat::guard]; expected one of: {OPTIONS}"),
            ));
        }
        input
            .parse::<Token![=]>()
            .map_err(|e| syn::Error::new(e.span(), format!("expected `=` after `{n}`")))?;
        match n.as_str() {
            "store" => Ok(Opt::Store(name, input.parse()?)),
            "tx" => {
                let binding: Ident = input.parse().map_err(|e| {
                    syn::Error::new(
                        e.span(),
                        "`tx` takes the name the body uses for the transaction: `tx = tx`",
                    )
                })?;
                Ok(Opt::Tx(name, binding))
            }
            "mode" | "on_store_failure" | "abandoned" => {
                let word: Ident = input.parse().map_err(|e| {
                    let expected = match n.as_str() {
                        "mode" => "`once` or `window`",
                        "abandoned" => "`unknown` or `retry`",
                        _ => "`fail_open` or `fail_closed`",
                    };
                    syn::Error::new(e.span(), format!("`{n}` takes {expected}"))
                })?;
                Ok(Opt::Word(name, word))
            }
            _ => {
                let lit: LitStr = input.parse().map_err(|e| {
                    let example = match n.as_str() {
                        "key" => "`key = \"{order.id}\"`",
                        "scope" => "`scope = \"billing::charge\"`",
                        _ => "a duration such as `\"3s\"`",
                    };
                    syn::Error::new(e.span(), format!("`{n}` takes a string literal: {example}"))
                })?;
                Ok(Opt::Str(name, lit))
            }
        }
    }
}

/// `mode = ...`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum GuardMode {
    Window,
    Once,
}

/// The attribute's arguments, validated.
pub(crate) struct Args {
    pub(crate) store: Option<Expr>,
    pub(crate) key: Option<LitStr>,
    pub(crate) mode: Option<(GuardMode, Span)>,
    pub(crate) window: Option<(u64, Span)>,
    pub(crate) retention: Option<(u64, Span)>,
    pub(crate) lease: Option<(u64, Span)>,
    pub(crate) wait: Option<(u64, Span)>,
    pub(crate) scope: Option<LitStr>,
    pub(crate) fail_closed: bool,
    /// `abandoned = retry` (`true`) or `unknown` (`false`): what a call does
    /// with a claim whose owner died; the mode's default when absent.
    pub(crate) abandoned: Option<(bool, Span)>,
    /// `tx = name`: once mode in a database transaction (`run_once_in_tx`).
    pub(crate) tx: Option<Ident>,
}

impl Args {
    /// Whether the mode is `once` (the default is `window`).
    pub(crate) fn once(&self) -> bool {
        matches!(self.mode, Some((GuardMode::Once, _)))
    }
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let opts = Punctuated::<Opt, Token![,]>::parse_terminated(input)?;
        let mut args = Args {
            store: None,
            key: None,
            mode: None,
            window: None,
            retention: None,
            lease: None,
            wait: None,
            scope: None,
            fail_closed: false,
            abandoned: None,
            tx: None,
        };
        let mut seen: Vec<String> = Vec::new();
        for opt in opts {
            let name = opt.name().to_string();
            if seen.contains(&name) {
                return Err(syn::Error::new(
                    opt.name().span(),
                    format!("`{name}` is given twice"),
                ));
            }
            seen.push(name);
            match opt {
                Opt::Store(_, e) => args.store = Some(e),
                Opt::Tx(_, binding) => args.tx = Some(binding),
                Opt::Word(n, w) if n == "mode" => {
                    let mode = match w.to_string().as_str() {
                        "once" => GuardMode::Once,
                        "window" => GuardMode::Window,
                        other => {
                            return Err(syn::Error::new(
                                w.span(),
                                format!("unknown mode `{other}`; expected `once` or `window`"),
                            ));
                        }
                    };
                    args.mode = Some((mode, w.span()));
                }
                Opt::Word(n, w) if n == "abandoned" => {
                    let retry = match w.to_string().as_str() {
                        "retry" => true,
                        "unknown" => false,
                        other => {
                            return Err(syn::Error::new(
                                w.span(),
                                format!(
                                    "unknown `abandoned` choice `{other}`; expected `unknown` (a dead call's outcome is unknown: never run again) or `retry` (a later call takes its claim over)"
                                ),
                            ));
                        }
                    };
                    args.abandoned = Some((retry, w.span()));
                }
                Opt::Word(_, w) => {
                    args.fail_closed = match w.to_string().as_str() {
                        "fail_open" => false,
                        "fail_closed" => true,
                        other => {
                            return Err(syn::Error::new(
                                w.span(),
                                format!(
                                    "unknown failure policy `{other}`; expected `fail_open` or `fail_closed`"
                                ),
                            ));
                        }
                    };
                }
                Opt::Str(n, lit) => match n.to_string().as_str() {
                    "key" => args.key = Some(lit),
                    "scope" => {
                        if lit.value().is_empty() {
                            return Err(syn::Error::new(lit.span(), "`scope` must not be empty"));
                        }
                        args.scope = Some(lit);
                    }
                    which => {
                        let ms = duration_ms(&lit)?;
                        let v = Some((ms, lit.span()));
                        match which {
                            "window" => args.window = v,
                            "retention" => args.retention = v,
                            "wait" => args.wait = v,
                            _ => args.lease = v,
                        }
                    }
                },
            }
        }
        // Mode-specific options.
        let once = args.once();
        if let (true, Some((_, span))) = (once, args.window) {
            return Err(syn::Error::new(
                span,
                "`window` is for the window mode; `mode = once` holds the key for `retention` instead",
            ));
        }
        if let (false, Some((_, span))) = (once, args.abandoned) {
            return Err(syn::Error::new(
                span,
                "`abandoned` is only for `mode = once`",
            ));
        }
        if !once {
            for (name, opt) in [
                ("retention", args.retention),
                ("lease", args.lease),
                ("wait", args.wait),
            ] {
                if let Some((_, span)) = opt {
                    return Err(syn::Error::new(
                        span,
                        format!("`{name}` is only for `mode = once`"),
                    ));
                }
            }
        }
        if let Some(tx) = &args.tx {
            if !once {
                return Err(syn::Error::new(
                    tx.span(),
                    "`tx` is only for `mode = once`: the transaction commits the body's writes with its stored result",
                ));
            }
            if let Some((_, span)) = args.wait {
                return Err(syn::Error::new(
                    span,
                    "`wait` does not go with `tx`: a repeat gets the stored result or `Rejected::InProgress` at once",
                ));
            }
            if args.store.is_none() {
                return Err(syn::Error::new(
                    tx.span(),
                    "`tx` needs `store = ...` naming a SQL store (`PgStore` or `SqliteStore`): the transaction is opened on its pool",
                ));
            }
        }
        Ok(args)
    }
}

/// A duration literal, in the one grammar of [`crate::duration`]; its
/// errors point at the literal.
fn duration_ms(lit: &LitStr) -> syn::Result<u64> {
    parse_ms(&lit.value()).map_err(|e| {
        let msg = match e {
            DurationError::Invalid => format!(
                "invalid duration {:?}: write a whole number and a unit (`ms`, `s`, `m`, `h`, `d`), such as \"3s\" or \"500ms\"",
                lit.value()
            ),
            DurationError::Zero => "a duration must be longer than zero".to_owned(),
        };
        syn::Error::new(lit.span(), msg)
    })
}

#[cfg(test)]
mod tests {
    use super::duration_ms;
    use crate::duration::{CASES, DurationError, parse_ms, short_strings};
    use proc_macro2::Span;
    use syn::LitStr;

    /// The attribute's side: the literal as the macro reads it.
    fn literal(s: &str) -> Result<u64, String> {
        duration_ms(&LitStr::new(s, Span::call_site())).map_err(|e| e.to_string())
    }

    #[test]
    fn the_attribute_accepts_what_the_grammar_accepts() {
        for (s, want) in CASES {
            match (want, literal(s)) {
                (Ok(ms), got) => assert_eq!(got, Ok(*ms), "{s:?}"),
                (Err(DurationError::Zero), got) => {
                    assert_eq!(got, Err("a duration must be longer than zero".to_owned()));
                }
                (Err(DurationError::Invalid), got) => assert_eq!(
                    got,
                    Err(format!(
                        "invalid duration {s:?}: write a whole number and a unit (`ms`, `s`, `m`, `h`, `d`), such as \"3s\" or \"500ms\""
                    ))
                ),
            }
        }
    }

    /// Every short string, through a literal token and back, gets the
    /// grammar's answer and the message of its kind of error.
    #[test]
    fn a_literal_gets_the_grammar_s_answer() {
        for s in short_strings() {
            match (parse_ms(&s), literal(&s)) {
                (Ok(ms), got) => assert_eq!(got, Ok(ms), "{s:?}"),
                (Err(DurationError::Zero), Err(e)) => {
                    assert!(e.contains("longer than zero"), "{s:?}")
                }
                (Err(DurationError::Invalid), Err(e)) => {
                    assert!(e.starts_with("invalid duration"), "{s:?}");
                }
                (want, got) => panic!("{s:?}: the grammar says {want:?}, the attribute {got:?}"),
            }
        }
    }
}
