//! `#[boundary]`: the attribute that makes "no panic crosses into Python" structural.
//!
//! Put it above `#[pyfunction]` or `#[pymethods]`. Every function it covers has its body
//! run under `crate::boundary::catch`, which turns a panic into `kvikpy.InternalError`
//! carrying the panic message. A function whose return type is not a `Result` is changed
//! to return `PyResult` of it (pyo3 accepts either), so every entry point can fail
//! cleanly. `make lint` checks that every `#[pyfunction]` and `#[pymethods]` of the binding
//! crate carries the attribute (tests/test_boundary.py).

use proc_macro::TokenStream;
use quote::quote;
use syn::{parse_macro_input, parse_quote, Block, ImplItem, Item, ReturnType, Signature, Type};

/// Wrap every function of a `#[pymethods]` block, or one `#[pyfunction]`, so a panic in
/// it reaches Python as `kvikpy.InternalError` instead of pyo3's `PanicException`.
#[proc_macro_attribute]
pub fn boundary(args: TokenStream, input: TokenStream) -> TokenStream {
    if !args.is_empty() {
        return syn::Error::new(
            proc_macro2::Span::call_site(),
            "#[boundary] takes no arguments",
        )
        .to_compile_error()
        .into();
    }
    let mut item = parse_macro_input!(input as Item);
    match &mut item {
        Item::Fn(f) => guard(&mut f.sig, &mut f.block),
        Item::Impl(block) => {
            for member in &mut block.items {
                if let ImplItem::Fn(f) = member {
                    // pyo3 requires `__releasebuffer__` to return `()`; it only frees.
                    if f.sig.ident != "__releasebuffer__" {
                        guard(&mut f.sig, &mut f.block);
                    }
                }
            }
        }
        other => {
            return syn::Error::new_spanned(other, "#[boundary] goes on a fn or an impl block")
                .to_compile_error()
                .into()
        }
    }
    quote!(#item).into()
}

/// Whether `ty` is spelled as a `Result` (`PyResult`, `BindResult`, `Result`).
fn is_result(ty: &Type) -> bool {
    match ty {
        Type::Path(p) => p
            .path
            .segments
            .last()
            .is_some_and(|s| s.ident.to_string().ends_with("Result")),
        _ => false,
    }
}

fn guard(sig: &mut Signature, block: &mut Block) {
    let body = &*block;
    let wrapped: Block = match &sig.output {
        ReturnType::Type(_, ty) if is_result(ty) => parse_quote!({
            crate::boundary::catch(move || -> #ty #body)
        }),
        output => {
            let inner: Type = match output {
                ReturnType::Default => parse_quote!(()),
                ReturnType::Type(_, ty) => (**ty).clone(),
            };
            sig.output = parse_quote!(-> ::pyo3::PyResult<#inner>);
            parse_quote!({
                crate::boundary::catch(move || -> ::pyo3::PyResult<#inner> {
                    ::std::result::Result::Ok((move || -> #inner #body)())
                })
            })
        }
    };
    *block = wrapped;
}
