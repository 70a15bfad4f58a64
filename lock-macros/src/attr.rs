//! Parsing: the attribute's arguments and the function it sits on.
//!
//! Arguments are read into typed slots, keeping the `syn` nodes for their
//! spans. Every mistake found here is collected, so one compile shows them
//! all; meaning (durations, key placeholders, ranges) is `valid.rs`'s job.

use crate::errors::{Errors, closest};
use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::{
    Attribute, Expr, ExprLit, Ident, Lit, LitBool, LitInt, LitStr, Signature, Token, UnOp,
    Visibility,
};

/// Every argument, in the order the docs list them, with how it is written.
const ARGUMENTS: [(&str, &str); 13] = [
    ("key", "key = \"order:{order_id}\""),
    ("keys", "keys = [\"account:{from}\", \"account:{to}\"]"),
    ("ttl", "ttl = \"30s\""),
    ("wait", "wait = \"5s\""),
    ("renew", "renew = true"),
    ("on_lost", "on_lost = \"abort\""),
    ("fencing", "fencing = true"),
    ("min_hold", "min_hold = \"5s\""),
    ("max_hold", "max_hold = \"10m\""),
    ("mode", "mode = \"shared\""),
    ("permits", "permits = 3"),
    ("client", "client = self.locks"),
    ("crate", "crate = \"::lock_core\""),
];

/// Words people reach for, and the argument that does it.
const ALIASES: [(&str, &str); 11] = [
    ("name", "key"),
    ("lease", "ttl"),
    ("expiry", "ttl"),
    ("expire", "ttl"),
    ("timeout", "wait"),
    ("wait_timeout", "wait"),
    ("fence", "fencing"),
    ("lock_client", "client"),
    ("shared", "mode"),
    ("semaphore", "permits"),
    ("max_holders", "permits"),
];

/// Words people reach for to run a function on one replica only, the
/// leader: `wait = "forever"` does it.
const LEADER_WORDS: [&str; 7] = [
    "leader",
    "leader_only",
    "only_leader",
    "elect",
    "election",
    "campaign",
    "singleton",
];

/// The attribute's arguments as written; `None` when not given (or given
/// wrong: then `errors` says so, and the other arguments are still checked).
#[derive(Default)]
pub(crate) struct Args {
    pub(crate) errors: Option<syn::Error>,
    /// Whether a `key` or `keys` was written at all, even wrongly (then
    /// `errors` has said so, and "missing `key`" would only repeat it).
    pub(crate) key_written: bool,
    /// Every argument name written, in order, whether or not its value
    /// parsed: for the errors about two arguments that exclude each other.
    pub(crate) names: Vec<Ident>,
    pub(crate) key: Option<LitStr>,
    pub(crate) keys: Option<Keys>,
    pub(crate) ttl: Option<LitStr>,
    pub(crate) wait: Option<LitStr>,
    pub(crate) renew: Option<LitBool>,
    pub(crate) on_lost: Option<LitStr>,
    pub(crate) fencing: Option<LitBool>,
    pub(crate) min_hold: Option<LitStr>,
    pub(crate) max_hold: Option<LitStr>,
    pub(crate) mode: Option<LitStr>,
    pub(crate) permits: Option<LitInt>,
    pub(crate) client: Option<Expr>,
    pub(crate) krate: Option<LitStr>,
}

/// `keys = [..]` as written.
pub(crate) struct Keys {
    /// The brackets: an empty list is reported there.
    pub(crate) brackets: Span,
    pub(crate) templates: Vec<LitStr>,
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Args> {
        let mut args = Args::default();
        let mut errors = Errors::default();
        while !input.is_empty() {
            if input.peek(LitStr) || input.peek(syn::token::Bracket) {
                let value: Expr = input.parse()?;
                let written = match &value {
                    Expr::Array(array) => format!("keys = {}", list(array)),
                    _ => format!("key = {}", value.to_token_stream()),
                };
                args.key_written = true;
                errors.push(syn::Error::new_spanned(
                    &value,
                    format!("name this argument: write `{written}`"),
                ));
            } else {
                let name = input.call(Ident::parse_any)?;
                args.key_written |= name == "key" || name == "keys";
                args.names.push(name.unraw());
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
    /// Records `name = value`. One arm per argument: each parses its own
    /// value and refuses to be set twice; a name no arm knows is an error.
    fn set(&mut self, name: &Ident, value: Expr) -> syn::Result<()> {
        match name.unraw().to_string().as_str() {
            "key" => once(&mut self.key, name, || key(value)),
            "keys" => once(&mut self.keys, name, || keys(value)),
            "ttl" => once(&mut self.ttl, name, || duration("ttl", value)),
            "wait" => once(&mut self.wait, name, || wait(value)),
            "renew" => once(&mut self.renew, name, || boolean("renew", value)),
            "on_lost" => once(&mut self.on_lost, name, || on_lost(value)),
            "fencing" => once(&mut self.fencing, name, || boolean("fencing", value)),
            "min_hold" => once(&mut self.min_hold, name, || duration("min_hold", value)),
            "max_hold" => once(&mut self.max_hold, name, || duration("max_hold", value)),
            "mode" => once(&mut self.mode, name, || mode(value)),
            "permits" => once(&mut self.permits, name, || permits(value)),
            "client" => once(&mut self.client, name, || client(value)),
            "crate" => once(&mut self.krate, name, || krate(value)),
            _ => Err(unknown_argument(name)),
        }
    }
}

/// Fills `slot` with the value `parse` reads, unless the argument `name` was
/// given before.
fn once<T>(
    slot: &mut Option<T>,
    name: &Ident,
    parse: impl FnOnce() -> syn::Result<T>,
) -> syn::Result<()> {
    if slot.is_some() {
        let text = name.unraw();
        return Err(syn::Error::new(
            name.span(),
            format!("`{text}` is set more than once: keep a single `{text} = ...`"),
        ));
    }
    *slot = Some(parse()?);
    Ok(())
}

fn unknown_argument(name: &Ident) -> syn::Error {
    let text = name.unraw().to_string();
    let names = ARGUMENTS.map(|(argument, _)| argument);
    let valid = names.map(|a| format!("`{a}`")).join(", ");
    let hint = if LEADER_WORDS.contains(&text.as_str()) {
        "to run the function only on the elected leader, write `wait = \"forever\"`; ".to_owned()
    } else {
        ALIASES
            .iter()
            .find(|(alias, _)| *alias == text)
            .map(|(_, argument)| *argument)
            .or_else(|| closest(&text, names))
            .map(|argument| format!("did you mean `{argument}`? "))
            .unwrap_or_default()
    };
    syn::Error::new(
        name.span(),
        format!("unknown argument `{text}`: {hint}the arguments are {valid}"),
    )
}

fn missing_value(name: &Ident) -> syn::Error {
    let text = name.unraw().to_string();
    match ARGUMENTS.iter().find(|(argument, _)| *argument == text) {
        Some((_, example)) => syn::Error::new(
            name.span(),
            format!("`{text}` needs a value: write `{example}`"),
        ),
        None => unknown_argument(name),
    }
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

/// `keys = ["..", ".."]`: a list of string literals. Whether it is empty or
/// repeats a template is `valid.rs`'s business.
fn keys(value: Expr) -> syn::Result<Keys> {
    let array = match value {
        Expr::Array(array) if array.attrs.is_empty() => array,
        value => {
            let message = match literal(&value) {
                Some(Lit::Str(lit)) => format!(
                    "`keys` takes a list: write `keys = [{}]`, or `key = {}` for a single lock",
                    lit.to_token_stream(),
                    lit.to_token_stream()
                ),
                _ => "`keys` is a list of string literals, checked at compile time, like `keys = [\"account:{from}\", \"account:{to}\"]`".to_owned(),
            };
            return Err(syn::Error::new_spanned(value, message));
        }
    };
    let mut errors = Errors::default();
    let mut templates = Vec::with_capacity(array.elems.len());
    for elem in &array.elems {
        match literal(elem) {
            Some(Lit::Str(lit)) => templates.push(lit.clone()),
            _ => errors.push(syn::Error::new_spanned(
                elem,
                "each of `keys` is a string literal, checked at compile time: put parameters in placeholders, like `\"account:{from}\"`",
            )),
        }
    }
    errors.finish()?;
    Ok(Keys {
        brackets: array.bracket_token.span.join(),
        templates,
    })
}

/// `["a", "b"]` as a person writes it, for messages.
fn list(array: &syn::ExprArray) -> String {
    let elems: Vec<String> = array
        .elems
        .iter()
        .map(|elem| elem.to_token_stream().to_string())
        .collect();
    format!("[{}]", elems.join(", "))
}

/// `mode = ".."`: a string; which ones are choices is `valid.rs`'s business.
fn mode(value: Expr) -> syn::Result<LitStr> {
    let word = match &value {
        Expr::Lit(_) => match literal(&value) {
            Some(Lit::Str(lit)) => return Ok(lit.clone()),
            _ => None,
        },
        Expr::Path(path) => path.path.get_ident().map(|ident| ident.to_string()),
        _ => None,
    };
    let message = match word.as_deref() {
        Some(word @ ("exclusive" | "shared")) => {
            format!("`mode` takes a string: write `mode = \"{word}\"`")
        }
        _ => "`mode` is \"exclusive\" (one holder at a time, the default) or \"shared\" (any number of shared holders at once)".to_owned(),
    };
    Err(syn::Error::new_spanned(value, message))
}

/// `permits = N`: an integer literal; its range is `valid.rs`'s business,
/// except the sign, which only the expression shows.
fn permits(value: Expr) -> syn::Result<LitInt> {
    let message = match &value {
        Expr::Lit(_) => match literal(&value) {
            Some(Lit::Int(int)) => return Ok(int.clone()),
            Some(Lit::Str(lit)) if lit.value().parse::<u64>().is_ok() => format!(
                "`permits` takes a number, not a string: write `permits = {}` without quotes",
                lit.value()
            ),
            Some(Lit::Float(float)) => {
                format!("`permits = {float}` is not a whole number: {PERMITS}")
            }
            _ => PERMITS.to_owned(),
        },
        Expr::Unary(unary)
            if matches!(unary.op, UnOp::Neg(_))
                && matches!(literal(&unary.expr), Some(Lit::Int(_) | Lit::Float(_))) =>
        {
            format!(
                "`permits = {}` is negative: {PERMITS}",
                value.to_token_stream().to_string().replace(' ', "")
            )
        }
        _ => PERMITS.to_owned(),
    };
    Err(syn::Error::new_spanned(value, message))
}

/// What `permits` is, for its errors.
pub(crate) const PERMITS: &str = "`permits` is how many holders may hold the lock at once, an integer literal of at least 1, like `permits = 3`";

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

/// `wait = ".."`: a duration string, or `"forever"` (checked in
/// `valid.rs`); `wait = forever` without quotes is told to add them.
fn wait(value: Expr) -> syn::Result<LitStr> {
    match &value {
        Expr::Path(path) if path.path.is_ident("forever") => Err(syn::Error::new_spanned(
            value,
            "`wait` takes a string: write `wait = \"forever\"`",
        )),
        _ => duration("wait", value),
    }
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
