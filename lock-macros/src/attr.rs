//! Parsing: the attribute's arguments and the function it sits on.
//!
//! Arguments are read into typed slots, keeping the `syn` nodes for their
//! spans. Every mistake found here is collected, so one compile shows them
//! all; meaning (durations, key placeholders, ranges) is `valid.rs`'s job.

use crate::Errors;
use crate::valid::closest;
use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::{Attribute, Expr, ExprLit, Ident, Lit, LitBool, LitStr, Signature, Token, Visibility};

/// Every argument, in the order the docs list them.
pub(crate) const ARGUMENTS: [&str; 10] = [
    "key", "ttl", "wait", "renew", "on_lost", "fencing", "min_hold", "max_hold", "client", "crate",
];

/// Words people reach for, and the argument that does it.
const ALIASES: [(&str, &str); 8] = [
    ("name", "key"),
    ("lease", "ttl"),
    ("expiry", "ttl"),
    ("expire", "ttl"),
    ("timeout", "wait"),
    ("wait_timeout", "wait"),
    ("fence", "fencing"),
    ("lock_client", "client"),
];

/// The attribute's arguments as written; `None` when not given (or given
/// wrong: then `errors` says so, and the other arguments are still checked).
#[derive(Default)]
pub(crate) struct Args {
    pub(crate) errors: Option<syn::Error>,
    /// Whether a key was written at all, even wrongly (then `errors` has
    /// said so, and "missing `key`" would only repeat it).
    pub(crate) key_written: bool,
    pub(crate) key: Option<LitStr>,
    pub(crate) ttl: Option<LitStr>,
    pub(crate) wait: Option<LitStr>,
    pub(crate) renew: Option<LitBool>,
    pub(crate) on_lost: Option<LitStr>,
    pub(crate) fencing: Option<LitBool>,
    pub(crate) min_hold: Option<LitStr>,
    pub(crate) max_hold: Option<LitStr>,
    pub(crate) client: Option<Expr>,
    pub(crate) krate: Option<LitStr>,
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Args> {
        let mut args = Args::default();
        let mut errors = Errors::default();
        while !input.is_empty() {
            if input.peek(LitStr) {
                let lit: LitStr = input.parse()?;
                args.key_written = true;
                errors.push(syn::Error::new(
                    lit.span(),
                    format!(
                        "name this argument: write `key = {}`",
                        lit.to_token_stream()
                    ),
                ));
            } else {
                let name = input.call(Ident::parse_any)?;
                args.key_written |= name == "key";
                if input.peek(Token![=]) {
                    input.parse::<Token![=]>()?;
                    let value: Expr = input.parse()?;
                    if let Err(e) = args.set(&name, value) {
                        errors.push(e);
                    }
                } else {
                    errors.push(missing_value(&name));
                    // Skip what stands in for the value (`key("..")`), to
                    // report the arguments after it too.
                    while !input.is_empty() && !input.peek(Token![,]) {
                        input.parse::<proc_macro2::TokenTree>()?;
                    }
                }
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        args.errors = errors.finish().err();
        Ok(args)
    }
}

impl Args {
    /// Records `name = value`, rejecting unknown and repeated arguments and
    /// values of the wrong kind.
    fn set(&mut self, name: &Ident, value: Expr) -> syn::Result<()> {
        let text = name.unraw().to_string();
        let already = match text.as_str() {
            "key" => self.key.is_some(),
            "ttl" => self.ttl.is_some(),
            "wait" => self.wait.is_some(),
            "renew" => self.renew.is_some(),
            "on_lost" => self.on_lost.is_some(),
            "fencing" => self.fencing.is_some(),
            "min_hold" => self.min_hold.is_some(),
            "max_hold" => self.max_hold.is_some(),
            "client" => self.client.is_some(),
            "crate" => self.krate.is_some(),
            _ => return Err(unknown_argument(name, &text)),
        };
        if already {
            return Err(syn::Error::new(
                name.span(),
                format!("`{text}` is set more than once: keep a single `{text} = ...`"),
            ));
        }
        match text.as_str() {
            "key" => self.key = Some(key(value)?),
            "ttl" => self.ttl = Some(duration("ttl", value)?),
            "wait" => self.wait = Some(duration("wait", value)?),
            "renew" => self.renew = Some(boolean("renew", value)?),
            "fencing" => self.fencing = Some(boolean("fencing", value)?),
            "min_hold" => self.min_hold = Some(duration("min_hold", value)?),
            "max_hold" => self.max_hold = Some(duration("max_hold", value)?),
            "on_lost" => self.on_lost = Some(on_lost(value)?),
            "client" => self.client = Some(client(value)?),
            _ => self.krate = Some(krate(value)?),
        }
        Ok(())
    }
}

fn unknown_argument(name: &Ident, text: &str) -> syn::Error {
    let valid = ARGUMENTS.map(|a| format!("`{a}`")).join(", ");
    let hint = ALIASES
        .iter()
        .find(|(alias, _)| *alias == text)
        .map(|(_, argument)| *argument)
        .or_else(|| closest(text, ARGUMENTS))
        .map(|argument| format!("did you mean `{argument}`? "))
        .unwrap_or_default();
    syn::Error::new(
        name.span(),
        format!("unknown argument `{text}`: {hint}the arguments are {valid}"),
    )
}

fn missing_value(name: &Ident) -> syn::Error {
    let text = name.unraw().to_string();
    let example = match text.as_str() {
        "key" => "key = \"order:{order_id}\"",
        "ttl" => "ttl = \"30s\"",
        "wait" => "wait = \"5s\"",
        "renew" => "renew = true",
        "on_lost" => "on_lost = \"abort\"",
        "fencing" => "fencing = true",
        "min_hold" => "min_hold = \"5s\"",
        "max_hold" => "max_hold = \"10m\"",
        "client" => "client = self.locks",
        "crate" => "crate = \"::lock_core\"",
        _ => return unknown_argument(name, &text),
    };
    syn::Error::new(
        name.span(),
        format!("`{text}` needs a value: write `{example}`"),
    )
}

fn literal(value: &Expr) -> Option<&Lit> {
    match value {
        Expr::Lit(ExprLit { lit, attrs }) if attrs.is_empty() => Some(lit),
        _ => None,
    }
}

fn key(value: Expr) -> syn::Result<LitStr> {
    match literal(&value) {
        Some(Lit::Str(lit)) => Ok(lit.clone()),
        _ => Err(syn::Error::new_spanned(
            value,
            "`key` is a string literal, checked at compile time: put parameters in placeholders, like `key = \"order:{order_id}\"`",
        )),
    }
}

fn duration(name: &str, value: Expr) -> syn::Result<LitStr> {
    let message = match literal(&value) {
        Some(Lit::Str(lit)) => return Ok(lit.clone()),
        Some(Lit::Int(int)) => format!(
            "`{name}` is a duration string with a unit: write `{name} = \"{}s\"` or `{name} = \"{}ms\"`",
            int.base10_digits(),
            int.base10_digits()
        ),
        _ => format!(
            "`{name}` is a duration string like \"500ms\", \"30s\", \"2m\", \"1h\" or \"1m30s\""
        ),
    };
    Err(syn::Error::new_spanned(value, message))
}

fn boolean(name: &str, value: Expr) -> syn::Result<LitBool> {
    let message = match literal(&value) {
        Some(Lit::Bool(lit)) => return Ok(lit.clone()),
        Some(Lit::Str(lit)) if matches!(lit.value().as_str(), "true" | "false") => format!(
            "`{name}` takes a bool, not a string: write `{name} = {}` without quotes",
            lit.value()
        ),
        _ => format!("`{name}` is `true` or `false`"),
    };
    Err(syn::Error::new_spanned(value, message))
}

fn on_lost(value: Expr) -> syn::Result<LitStr> {
    let message = match &value {
        Expr::Lit(_) => match literal(&value) {
            Some(Lit::Str(lit)) => return Ok(lit.clone()),
            _ => None,
        },
        // `on_lost = continue` parses as a `continue` expression.
        Expr::Continue(_) => Some("continue".to_owned()),
        Expr::Path(path) => path.path.get_ident().map(|ident| ident.to_string()),
        _ => None,
    };
    let message = match message.as_deref() {
        Some(word @ ("abort" | "continue")) => {
            format!("`on_lost` takes a string: write `on_lost = \"{word}\"`")
        }
        _ => "`on_lost` is \"abort\" (stop the body and return the Lost error) or \"continue\" (let the body finish)".to_owned(),
    };
    Err(syn::Error::new_spanned(value, message))
}

fn client(value: Expr) -> syn::Result<Expr> {
    match literal(&value) {
        Some(Lit::Str(lit)) => {
            let message = match lit.parse::<Expr>() {
                Ok(expr) => format!(
                    "`client` takes an expression, not a string: write `client = {}`",
                    expr.to_token_stream()
                ),
                Err(_) => "`client` takes an expression giving the client, like `client = self.locks` or `client = &LOCKS`".to_owned(),
            };
            Err(syn::Error::new(lit.span(), message))
        }
        _ => Ok(value),
    }
}

fn krate(value: Expr) -> syn::Result<LitStr> {
    match literal(&value) {
        Some(Lit::Str(lit)) => Ok(lit.clone()),
        _ => {
            let message = match &value {
                Expr::Path(path) => format!(
                    "`crate` takes the path as a string: write `crate = \"{}\"`",
                    path.to_token_stream().to_string().replace(' ', "")
                ),
                _ => "`crate` is the path to lock-core as a string, like `crate = \"::my_locks\"`"
                    .to_owned(),
            };
            Err(syn::Error::new_spanned(value, message))
        }
    }
}

/// The function the attribute sits on.
pub(crate) struct LockedFn {
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) sig: Signature,
    pub(crate) body: Body,
}

/// A function body, kept as tokens: the attribute never looks inside it.
pub(crate) struct Body {
    /// Where the braces are, so errors about the body's value point at it.
    pub(crate) brace: Span,
    /// `#![...]` at the top of the body; they stay on the function.
    pub(crate) inner_attrs: Vec<Attribute>,
    pub(crate) stmts: TokenStream,
}

impl Parse for LockedFn {
    fn parse(input: ParseStream<'_>) -> syn::Result<LockedFn> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis: Visibility = input.parse()?;
        let is_fn = input.peek(Token![fn])
            || input.peek(Token![async])
            || input.peek(Token![const])
            || input.peek(Token![unsafe])
            || input.peek(Token![extern]);
        if !is_fn {
            return Err(input.error(
                "`#[distributed_lock]` goes on an `async fn` (a free function or a method), not on this item",
            ));
        }
        let sig: Signature = input.parse()?;
        if input.peek(Token![;]) {
            let semi: Token![;] = input.parse()?;
            return Err(syn::Error::new(
                semi.span,
                "`#[distributed_lock]` needs the function's body: in a trait, put it on the method in each `impl` block",
            ));
        }
        let content;
        let brace = syn::braced!(content in input);
        let inner_attrs = content.call(Attribute::parse_inner)?;
        let stmts: TokenStream = content.parse()?;
        Ok(LockedFn {
            attrs,
            vis,
            sig,
            body: Body {
                brace: brace.span.join(),
                inner_attrs,
                stmts,
            },
        })
    }
}
