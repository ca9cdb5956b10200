//! Phase three: the guarded function, written out. Its body runs inside
//! `norepeat::attribute::Guarded::run_window` or `run_once`, or, with
//! `tx = name`, `run_once_in_tx`; the key is built first, from the
//! arguments.

use crate::key::{Part, key_parts};
use crate::options::Args;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, LitStr, Pat, ReturnType, Signature, Stmt};

/// The guarded function: `func` with its body wrapped, its signature and
/// attributes kept.
pub(crate) fn expand(args: Args, func: ItemFn) -> syn::Result<TokenStream2> {
    let sig = &func.sig;
    if sig.asyncness.is_none() {
        return Err(syn::Error::new(
            sig.fn_token.span(),
            "#[norepeat::guard] goes on an `async fn`",
        ));
    }
    let ret = result_type(sig)?;
    let Some(key) = &args.key else {
        return Err(syn::Error::new(
            Span::call_site(),
            "missing `key = \"...\"`: the key built from the arguments, such as `key = \"{order.user_id}:{order.biz_id}\"`",
        ));
    };
    let key = key_statement(key, sig)?;
    let guarded = guarded(&args, sig);
    let (store_value, store_span) = store(&args);
    let body = typed_body(&ret, &func.block.stmts);
    let run = match &args.tx {
        None => {
            let run = if args.once() {
                quote!(run_once)
            } else {
                quote!(run_window)
            };
            let run_call = quote_spanned!(store_span=> .#run(&__norepeat_store, &__norepeat_key, __norepeat_body));
            quote! {
                let __norepeat_store = #store_value;
                let __norepeat_body = #body;
                #guarded
                    #run_call
                    .await
            }
        }
        Some(tx) => run_in_tx(tx, &ret, &body, &store_value, store_span, &guarded),
    };
    let attrs = &func.attrs;
    let vis = &func.vis;
    Ok(quote! {
        #(#attrs)*
        #vis #sig {
            #key
            #run
        }
    })
}

/// The declared return type, if it may be a `Result`.
fn result_type(sig: &Signature) -> syn::Result<syn::Type> {
    match &sig.output {
        ReturnType::Type(_, ty) if !plainly_not_a_result(ty) => Ok(ty.as_ref().clone()),
        ReturnType::Type(_, ty) => Err(syn::Error::new(
            ty.span(),
            format!(
                "a guarded fn must return `Result<T, E>` with `E: From<norepeat::attribute::Rejected>` (a refusal is an error value); `{}` is not a `Result`",
                ty.to_token_stream()
                    .to_string()
                    .replace(" < ", "<")
                    .replace(" >", ">")
                    .replace(" ,", ",")
            ),
        )),
        ReturnType::Default => Err(syn::Error::new(
            sig.ident.span(),
            "a guarded fn must return `Result<T, E>` with `E: From<norepeat::attribute::Rejected>` (a refusal is an error value)",
        )),
    }
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

/// `let __norepeat_key = ...;`: the key template's parts, each
/// length-prefixed by `norepeat::keys::KeyParts`.
fn key_statement(key: &LitStr, sig: &Signature) -> syn::Result<TokenStream2> {
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
    let key_calls = key_parts(key, &names)?.into_iter().map(|part| match part {
        Part::Literal(text) => {
            let text = LitStr::new(&text, key_span);
            quote!(.literal(#text))
        }
        Part::Arg(fmt, arg) => {
            let fmt = LitStr::new(&fmt, key_span);
            quote!(.arg(::core::format_args!(#fmt, #arg)))
        }
    });
    Ok(quote! {
        let __norepeat_key: ::std::string::String =
            ::norepeat::keys::KeyParts::new() #(#key_calls)* .finish();
    })
}

/// The `Guarded` of the options, with its failure policy.
fn guarded(args: &Args, sig: &Signature) -> TokenStream2 {
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
    let guarded = if args.once() {
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
        let abandoned = args.abandoned.map(|(retry, _)| {
            if retry {
                quote!(.abandoned(::norepeat::idempotency::Abandoned::Retry))
            } else {
                quote!(.abandoned(::norepeat::idempotency::Abandoned::OutcomeUnknown))
            }
        });
        quote!(::norepeat::attribute::Guarded::once(#scope) #retention #lease #wait #abandoned)
    } else {
        let window = args.window.map_or_else(
            || quote!(::norepeat::attribute::DEFAULT_WINDOW),
            |(ms, _)| millis(ms),
        );
        quote!(::norepeat::attribute::Guarded::window(#scope, #window))
    };
    quote! {
        #guarded
            .on_store_failure(#policy)
    }
}

/// The store the call runs on, and the span its errors point at: `store =
/// EXPR`, or else the process-wide store, or `Rejected::NoDefaultStore`
/// (as the function's error) when none was set.
fn store(args: &Args) -> (TokenStream2, Span) {
    match &args.store {
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
    }
}

/// The body as an `async` block whose output is the function's return
/// type `ret`. An `async` block infers its output from its tail and its
/// `return`s, so `Ok(1)` or a `?` alone leave the error type open; a
/// `return` of a `ret` that is never reached (`if false`) pins it, and the
/// body checks as it did in the function (tokio's `#[tokio::main]` does
/// the same). The lints it allows are the dead code's.
///
/// The body's statements go in, not its block: a one-line body `{ Ok(1) }`
/// as the block's tail would be a block in a block ("unnecessary braces",
/// which `cargo fix` would "fix" into broken code).
fn typed_body(ret: &syn::Type, stmts: &[Stmt]) -> TokenStream2 {
    quote! {
        async {
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
    }
}

/// `tx = name`: the body runs in a transaction opened on the store's pool
/// (`Guarded::run_once_in_tx`), bound to `name`; the expansion gives it back
/// with the body's `Ok` value, and the stored result commits with it. The
/// closure is `move` (the transaction must be owned by the body's future),
/// so the body owns the arguments it uses; the key was built before.
fn run_in_tx(
    tx: &Ident,
    ret: &syn::Type,
    body: &TokenStream2,
    store_value: &TokenStream2,
    store_span: Span,
    guarded: &TokenStream2,
) -> TokenStream2 {
    // The closure is written in the call, so its argument's type (the
    // store's `Transaction`) is known from `run_once_in_tx`'s bound.
    let run = quote_spanned!(store_span=> run_once_in_tx);
    quote! {
        // Checked once to be a SQL store: a store that is not is one
        // error here, and the uses below see an error type (no more).
        let __norepeat_store = ::norepeat::attribute::__tx_store(#store_value);
        #guarded
            .#run(&__norepeat_store, &__norepeat_key, move |__norepeat_tx| async move {
            #[allow(unused_mut)]
            let mut #tx = __norepeat_tx;
            let __norepeat_result: #ret = #body
            .await;
            // The transaction goes back with the `Ok` value, to commit
            // with the stored result; on `Err` it is dropped (rolled back).
            ::core::result::Result::map(__norepeat_result, move |__norepeat_v| (#tx, __norepeat_v))
        })
        .await
    }
}
