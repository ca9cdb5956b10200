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
//!
//! It works in three phases, a module each (as tokio-macros splits its
//! `entry` into a parser and an output): `options` parses and checks the
//! attribute's `name = value` pairs, `key` reads the key template against
//! the function's arguments, and `expand` writes the guarded function.
//! `duration` is the duration grammar, one file shared with the library's
//! `norepeat::attribute::parse_duration`.

mod duration;
mod expand;
mod key;
mod options;

use proc_macro::TokenStream;
use proc_macro2::TokenStream as TokenStream2;
use quote::quote;
use syn::ItemFn;

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
    let args = match syn::parse::<options::Args>(attr) {
        Ok(a) => a,
        Err(e) => return fail(e),
    };
    let func = match syn::parse::<ItemFn>(item) {
        Ok(f) => f,
        Err(e) => return e.to_compile_error().into(),
    };
    match expand::expand(args, func) {
        Ok(t) => t.into(),
        Err(e) => fail(e),
    }
}
