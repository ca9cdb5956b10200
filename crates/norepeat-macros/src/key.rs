//! Phase two: the key template, `"{order.user_id}:{order.biz_id}"`, read
//! into literal text and argument paths checked against the function's
//! arguments.

use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{ToTokens, quote};
use syn::{Ident, LitStr};

/// One part of a key template: literal text, or an argument with its
/// format spec (`{id:?}` gives `"{:?}"`).
pub(crate) enum Part {
    Literal(String),
    Arg(String, TokenStream2),
}

/// The key template as parts: `"{order.user_id}:{order.biz_id}"` becomes
/// the argument `order.user_id`, the literal `:` and the argument
/// `order.biz_id`. The expansion length-prefixes each part
/// (`norepeat::keys::KeyParts`), so the key is injective: a `:` inside a
/// user id cannot pass for the template's own.
pub(crate) fn key_parts(lit: &LitStr, names: &[String]) -> syn::Result<Vec<Part>> {
    let span = lit.span();
    let err = |msg: String| syn::Error::new(span, msg);
    let template = lit.value();
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                text.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                text.push('}');
            }
            '}' => {
                return Err(err(
                    "unmatched `}` in the key; write `}}` for a literal brace".into(),
                ));
            }
            '{' => {
                let mut inner = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) => inner.push(c),
                        None => {
                            return Err(err(
                                "unclosed `{` in the key; write `{{` for a literal brace".into(),
                            ));
                        }
                    }
                }
                let (path, spec) = match inner.split_once(':') {
                    Some((p, s)) => (p.trim(), Some(s)),
                    None => (inner.trim(), None),
                };
                let arg = field_path(path, names, span)?;
                if !text.is_empty() {
                    parts.push(Part::Literal(std::mem::take(&mut text)));
                }
                let fmt = match spec {
                    Some(spec) => format!("{{:{spec}}}"),
                    None => "{}".to_owned(),
                };
                parts.push(Part::Arg(fmt, arg));
            }
            c => text.push(c),
        }
    }
    if !text.is_empty() {
        parts.push(Part::Literal(text));
    }
    Ok(parts)
}

/// `order.user_id` → tokens, checking that `order` is an argument.
fn field_path(path: &str, names: &[String], span: Span) -> syn::Result<TokenStream2> {
    if path.is_empty() {
        return Err(syn::Error::new(
            span,
            "empty `{}` in the key: name an argument or a field of one, such as `{order.id}`",
        ));
    }
    let mut segments = path.split('.');
    let first = segments.next().unwrap_or_default().trim();
    if !names.iter().any(|n| n == first) {
        let list = if names.is_empty() {
            "it has none".to_owned()
        } else {
            format!("it has: {}", names.join(", "))
        };
        return Err(syn::Error::new(
            span,
            format!(
                "`{{{path}}}` in the key: `{first}` is not an argument of this function ({list})"
            ),
        ));
    }
    let mut out = if first == "self" {
        syn::token::SelfValue { span }.into_token_stream()
    } else {
        Ident::new(first, span).into_token_stream()
    };
    for seg in segments {
        let seg = seg.trim();
        let dot = syn::token::Dot { spans: [span] };
        if !seg.is_empty() && seg.chars().all(|c| c.is_ascii_digit()) {
            let index: u32 = seg.parse().map_err(|_| {
                syn::Error::new(span, format!("`{seg}` in the key is not a field index"))
            })?;
            let index = syn::Index { index, span };
            out.extend(quote!(#dot #index));
        } else if is_ident(seg) {
            let ident = Ident::new(seg, span);
            out.extend(quote!(#dot #ident));
        } else {
            return Err(syn::Error::new(
                span,
                format!(
                    "`{{{path}}}` in the key: `{seg}` is not a field name; write argument.field.field"
                ),
            ));
        }
    }
    Ok(out)
}

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_alphabetic())
        && chars.all(|c| c == '_' || c.is_alphanumeric())
        && s != "_"
        && syn::parse_str::<Ident>(s).is_ok()
}
