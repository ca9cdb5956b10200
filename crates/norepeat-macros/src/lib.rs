//! The `#[norepeat::guard]` attribute (see the `norepeat` crate, which
//! re-exports it and documents it).
//!
//! The attribute rewrites the body of the `async fn` it is put on: the key
//! is built from the arguments (each literal segment of the template and
//! each formatted argument length-prefixed, by `norepeat::keys::KeyParts`,
//! so no two argument tuples share a key), then the original body runs inside
//! `norepeat::attribute::Guarded::run_window` or `run_once`. Because the function
//! itself changes (there is no proxy), every call is guarded, including a
//! call from another method of the same type.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{ToTokens, quote, quote_spanned};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, FnArg, Ident, ItemFn, LitStr, Pat, ReturnType, Token};

/// Guards an `async fn` against repeats; documented in `norepeat`, which
/// re-exports it as `norepeat::guard`.
#[proc_macro_attribute]
pub fn guard(attr: TokenStream, item: TokenStream) -> TokenStream {
    let original = TokenStream2::from(item.clone());
    // On an error, the function is kept as written, so the only error shown
    // is the attribute's (no cascade of "cannot find `f`" or unused imports).
    // Its arguments may be used only by the attribute (a `store`, a key
    // field): no "unused variable" warning follows the error.
    let fail = |e: syn::Error| {
        let mut out = e.to_compile_error();
        out.extend(quote!(#[allow(unused_variables)]));
        out.extend(original.clone());
        TokenStream::from(out)
    };
    let args = match syn::parse::<Args>(attr) {
        Ok(a) => a,
        Err(e) => return fail(e),
    };
    let func = match syn::parse::<ItemFn>(item) {
        Ok(f) => f,
        Err(e) => return e.to_compile_error().into(),
    };
    match expand(args, func) {
        Ok(t) => t.into(),
        Err(e) => fail(e),
    }
}

const OPTIONS: &str =
    "store, key, mode, window, retention, lease, wait, scope, on_store_failure, tx";

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
            "mode" | "on_store_failure" => {
                let word: Ident = input.parse().map_err(|e| {
                    let expected = if n == "mode" {
                        "`once` or `window`"
                    } else {
                        "`fail_open` or `fail_closed`"
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

#[derive(Clone, Copy, PartialEq, Eq)]
enum GuardMode {
    Window,
    Once,
}

/// The attribute's arguments, validated.
struct Args {
    store: Option<Expr>,
    key: Option<LitStr>,
    mode: Option<(GuardMode, Span)>,
    window: Option<(u64, Span)>,
    retention: Option<(u64, Span)>,
    lease: Option<(u64, Span)>,
    wait: Option<(u64, Span)>,
    scope: Option<LitStr>,
    fail_closed: bool,
    /// `tx = name`: once mode in a database transaction (`run_once_in_tx`).
    tx: Option<Ident>,
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
        let once = matches!(args.mode, Some((GuardMode::Once, _)));
        if let (true, Some((_, span))) = (once, args.window) {
            return Err(syn::Error::new(
                span,
                "`window` is for the window mode; `mode = once` holds the key for `retention` instead",
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

/// A duration literal: a whole number and `ms`, `s`, `m`, `h` or `d`.
fn duration_ms(lit: &LitStr) -> syn::Result<u64> {
    let bad = || {
        syn::Error::new(
            lit.span(),
            format!(
                "invalid duration {:?}: write a whole number and a unit (`ms`, `s`, `m`, `h`, `d`), such as \"3s\" or \"500ms\"",
                lit.value()
            ),
        )
    };
    let v = lit.value();
    let v = v.trim();
    let split = v.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (n, unit) = v.split_at(split);
    let n: u64 = n.parse().map_err(|_| bad())?;
    let factor: u64 = match unit.trim() {
        "ms" => 1,
        "s" => 1_000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    let ms = n.checked_mul(factor).ok_or_else(bad)?;
    if ms == 0 {
        return Err(syn::Error::new(
            lit.span(),
            "a duration must be longer than zero",
        ));
    }
    Ok(ms)
}

/// One part of a key template: literal text, or an argument with its
/// format spec (`{id:?}` gives `"{:?}"`).
enum Part {
    Literal(String),
    Arg(String, TokenStream2),
}

/// The key template as parts: `"{order.user_id}:{order.biz_id}"` becomes
/// the argument `order.user_id`, the literal `:` and the argument
/// `order.biz_id`. The expansion length-prefixes each part
/// (`norepeat::keys::KeyParts`), so the key is injective: a `:` inside a
/// user id cannot pass for the template's own.
fn key_parts(lit: &LitStr, names: &[String]) -> syn::Result<Vec<Part>> {
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

fn expand(args: Args, func: ItemFn) -> syn::Result<TokenStream2> {
    let sig = &func.sig;
    if sig.asyncness.is_none() {
        return Err(syn::Error::new(
            sig.fn_token.span(),
            "#[norepeat::guard] goes on an `async fn`",
        ));
    }
    let ret = match &sig.output {
        ReturnType::Type(_, ty) if !plainly_not_a_result(ty) => ty.as_ref().clone(),
        ReturnType::Type(_, ty) => {
            return Err(syn::Error::new(
                ty.span(),
                format!(
                    "a guarded fn must return `Result<T, E>` with `E: From<norepeat::attribute::Rejected>` (a refusal is an error value); `{}` is not a `Result`",
                    ty.to_token_stream()
                        .to_string()
                        .replace(" < ", "<")
                        .replace(" >", ">")
                        .replace(" ,", ",")
                ),
            ));
        }
        ReturnType::Default => {
            return Err(syn::Error::new(
                sig.ident.span(),
                "a guarded fn must return `Result<T, E>` with `E: From<norepeat::attribute::Rejected>` (a refusal is an error value)",
            ));
        }
    };
    let Some(key) = args.key else {
        return Err(syn::Error::new(
            Span::call_site(),
            "missing `key = \"...\"`: the key built from the arguments, such as `key = \"{order.user_id}:{order.biz_id}\"`",
        ));
    };
    let names: Vec<String> = sig
        .inputs
        .iter()
        .filter_map(|a| match a {
            FnArg::Receiver(_) => Some("self".to_owned()),
            FnArg::Typed(t) => match t.pat.as_ref() {
                Pat::Ident(p) => Some(p.ident.to_string()),
                _ => None,
            },
        })
        .collect();
    let key_span = key.span();
    let key_calls = key_parts(&key, &names)?.into_iter().map(|part| match part {
        Part::Literal(text) => {
            let text = LitStr::new(&text, key_span);
            quote!(.literal(#text))
        }
        Part::Arg(fmt, arg) => {
            let fmt = LitStr::new(&fmt, key_span);
            quote!(.arg(::core::format_args!(#fmt, #arg)))
        }
    });

    let name = sig.ident.to_string();
    let scope = match &args.scope {
        Some(s) => s.to_token_stream(),
        None => quote!(::core::concat!(::core::module_path!(), "::", #name)),
    };
    let policy = if args.fail_closed {
        quote!(::norepeat::degrade::FailurePolicy::FailClosed)
    } else {
        quote!(::norepeat::degrade::FailurePolicy::FailOpen)
    };
    let millis = |ms: u64| quote!(::core::time::Duration::from_millis(#ms));
    let once = matches!(args.mode, Some((GuardMode::Once, _)));
    let guarded = if once {
        let retention = args.retention.map(|(ms, _)| {
            let d = millis(ms);
            quote!(.retention(#d))
        });
        let lease = args.lease.map(|(ms, _)| {
            let d = millis(ms);
            quote!(.lease(#d))
        });
        let wait = args.wait.map(|(ms, _)| {
            let d = millis(ms);
            quote!(.wait(#d))
        });
        quote!(::norepeat::attribute::Guarded::once(#scope) #retention #lease #wait)
    } else {
        let window = args.window.map_or_else(
            || quote!(::norepeat::attribute::DEFAULT_WINDOW),
            |(ms, _)| millis(ms),
        );
        quote!(::norepeat::attribute::Guarded::window(#scope, #window))
    };
    let run = if once {
        quote!(run_once)
    } else {
        quote!(run_window)
    };
    // No `store = ...`: the process-wide store, or `Rejected::NoDefaultStore`
    // (as the function's error) when none was set.
    let (store_value, store_span) = match &args.store {
        Some(store) => (
            quote_spanned!(store.span()=> (#store).clone()),
            store.span(),
        ),
        None => (
            quote! {
                match ::norepeat::attribute::default_store() {
                    ::core::result::Result::Ok(store) => store,
                    ::core::result::Result::Err(rejected) => {
                        return ::core::result::Result::Err(::core::convert::From::from(rejected));
                    }
                }
            },
            Span::call_site(),
        ),
    };
    let run_call =
        quote_spanned!(store_span=> .#run(&__norepeat_store, &__norepeat_key, __norepeat_body));
    if let Some(tx) = &args.tx {
        let key_calls: Vec<TokenStream2> = key_calls.collect();
        return Ok(expand_tx(
            &func,
            &ret,
            tx,
            &key_calls,
            &store_value,
            store_span,
            &guarded,
            &policy,
        ));
    }

    // The body's statements, not its block: a one-line body `{ Ok(1) }` as
    // the async block's tail would be a block in a block ("unnecessary
    // braces", and `cargo fix` would break the code).
    let stmts = &func.block.stmts;
    let attrs = &func.attrs;
    let vis = &func.vis;
    Ok(quote! {
        #(#attrs)*
        #vis #sig {
            let __norepeat_key: ::std::string::String =
                ::norepeat::keys::KeyParts::new() #(#key_calls)* .finish();
            let __norepeat_store = #store_value;
            let __norepeat_body = async {
                #[allow(
                    unknown_lints,
                    unreachable_code,
                    clippy::diverging_sub_expression,
                    clippy::let_unit_value,
                    clippy::unreachable,
                    clippy::let_with_type_underscore,
                    clippy::empty_loop,
                    clippy::needless_return
                )]
                if false {
                    let __norepeat_fake_return: #ret = loop {};
                    return __norepeat_fake_return;
                }
                #(#stmts)*
            };
            #guarded
                .on_store_failure(#policy)
                #run_call
                .await
        }
    })
}

/// Whether `ty` is written as a type that cannot be a `Result`: a tuple, a
/// reference, an array, `impl Trait`, a primitive, or one of std's own
/// types named plainly (`String`, `Vec<T>`, `Option<T>`). Any other path
/// may be an alias of `Result` (`io::Result<T>`, `MyResult<T>`) and is left
/// to the type checker.
fn plainly_not_a_result(ty: &syn::Type) -> bool {
    const NOT_RESULTS: [&str; 22] = [
        "bool", "char", "str", "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32",
        "i64", "i128", "isize", "f32", "f64", "String", "Vec", "Option", "Box", "HashMap",
    ];
    match ty {
        syn::Type::Paren(t) => plainly_not_a_result(&t.elem),
        syn::Type::Group(t) => plainly_not_a_result(&t.elem),
        syn::Type::Path(p) => {
            p.qself.is_none()
                && p.path.segments.len() == 1
                && NOT_RESULTS.iter().any(|n| p.path.segments[0].ident == n)
        }
        syn::Type::Tuple(_)
        | syn::Type::Reference(_)
        | syn::Type::Array(_)
        | syn::Type::Slice(_)
        | syn::Type::Ptr(_)
        | syn::Type::Never(_)
        | syn::Type::ImplTrait(_)
        | syn::Type::TraitObject(_)
        | syn::Type::BareFn(_) => true,
        _ => false,
    }
}

/// `tx = name`: the body runs in a transaction opened on the store's pool
/// (`Guarded::run_once_in_tx`), bound to `name`; the expansion gives it back
/// with the body's `Ok` value, and the stored result commits with it. The
/// closure is `move` (the transaction must be owned by the body's future),
/// so the body owns the arguments it uses; the key was built before.
#[allow(clippy::too_many_arguments)]
fn expand_tx(
    func: &ItemFn,
    ret: &syn::Type,
    tx: &Ident,
    key_calls: &[TokenStream2],
    store_value: &TokenStream2,
    store_span: Span,
    guarded: &TokenStream2,
    policy: &TokenStream2,
) -> TokenStream2 {
    let sig = &func.sig;
    let stmts = &func.block.stmts;
    let attrs = &func.attrs;
    let vis = &func.vis;
    // The closure is written in the call, so its argument's type (the
    // store's `Transaction`) is known from `run_once_in_tx`'s bound.
    let run = quote_spanned!(store_span=> run_once_in_tx);
    quote! {
        #(#attrs)*
        #vis #sig {
            let __norepeat_key: ::std::string::String =
                ::norepeat::keys::KeyParts::new() #(#key_calls)* .finish();
            // Checked once to be a SQL store: a store that is not is one
            // error here, and the uses below see an error type (no more).
            let __norepeat_store = ::norepeat::attribute::__tx_store(#store_value);
            #guarded
                .on_store_failure(#policy)
                .#run(&__norepeat_store, &__norepeat_key, move |__norepeat_tx| async move {
                #[allow(unused_mut)]
                let mut #tx = __norepeat_tx;
                let __norepeat_result: #ret = async {
                    #[allow(
                        unknown_lints,
                        unreachable_code,
                        clippy::diverging_sub_expression,
                        clippy::let_unit_value,
                        clippy::unreachable,
                        clippy::let_with_type_underscore,
                        clippy::empty_loop,
                        clippy::needless_return
                    )]
                    if false {
                        let __norepeat_fake_return: #ret = loop {};
                        return __norepeat_fake_return;
                    }
                    #(#stmts)*
                }
                .await;
                // The transaction goes back with the `Ok` value, to commit
                // with the stored result; on `Err` it is dropped (rolled back).
                ::core::result::Result::map(__norepeat_result, move |__norepeat_v| (#tx, __norepeat_v))
            })
            .await
        }
    }
}
