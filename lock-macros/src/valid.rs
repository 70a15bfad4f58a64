//! Semantic checks: everything that can be wrong with a parsed attribute and
//! its function, each reported on the token to fix, all in one compile.
//!
//! What comes out, a [`Lock`], is everything `expand.rs` needs, already
//! resolved, so generating the code cannot fail.

use crate::attr::{self, Args, LockedFn, PERMITS};
use crate::duration::{self, DurationError};
use crate::errors::{Errors, closest};
use crate::limits::{MAX_DURATION, MIN_TTL};
use crate::template::{self, Placeholder, Root, Segment, TemplateError};
use proc_macro2::Span;
use quote::ToTokens;
use std::time::Duration;
use syn::visit::Visit;
use syn::{Expr, FnArg, Ident, LitInt, LitStr, Member, Pat, Path, ReturnType, Signature, Type};

/// A checked attribute on a checked function: what to generate.
pub(crate) struct Lock<'a> {
    /// The path to lock-core: `::lock_core` unless `crate = ".."` says otherwise.
    pub(crate) krate: Path,
    pub(crate) keys: KeySet,
    pub(crate) ttl: Option<Duration>,
    pub(crate) wait: Option<Duration>,
    pub(crate) renew: Option<bool>,
    pub(crate) on_lost: Option<OnLost>,
    pub(crate) fencing: Option<bool>,
    pub(crate) min_hold: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) mode: Option<Mode>,
    pub(crate) permits: Option<u32>,
    pub(crate) client: Option<&'a Expr>,
    /// The declared return type.
    pub(crate) ret: &'a Type,
    /// Whether the return type can be written inside the body: not when it
    /// holds an `impl Trait`.
    pub(crate) ret_nameable: bool,
    /// `E` of a return type spelled `Result<T, E>` (any path ending in
    /// `Result` with two type arguments), when it can be written inside the
    /// body; `None` for an alias like `io::Result<()>`.
    pub(crate) error: Option<&'a Type>,
}

/// `on_lost = ".."`.
#[derive(Clone, Copy)]
pub(crate) enum OnLost {
    Abort,
    Continue,
}

/// `mode = ".."`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Exclusive,
    Shared,
}

/// What to lock: `key = ".."`, or `keys = [..]` taken all at once, or an
/// election campaigned for with `wait = "forever"`.
pub(crate) enum KeySet {
    One(Key),
    /// In the order written, every template distinct.
    All(Vec<Key>),
    /// `key = ".."` with `wait = "forever"`: the function runs as the
    /// key's leader. Only the arguments that make sense for a leader are
    /// in the [`Lock`] (checked by `check_election`).
    Election(Key),
}

/// `wait = ".."`: a duration, or without bound.
#[derive(Clone, Copy)]
enum Wait {
    For(Duration),
    /// `wait = "forever"`: campaign for the key until this process leads.
    Forever,
}

/// What `wait = "forever"` does, for the errors about arguments that
/// cannot go with it.
const FOREVER: &str = "`wait = \"forever\"`, which campaigns to lead the key";

/// A key template whose placeholders all resolve.
pub(crate) struct Key {
    /// The key literal: errors about the values (a type without `Display`)
    /// point at it.
    pub(crate) span: Span,
    pub(crate) parts: Vec<KeyPart>,
}

/// Literal text, or a value to format with `Display`.
pub(crate) enum KeyPart {
    Text(String),
    /// `root.field.sub`, where `root` resolves to the parameter (or `self`)
    /// of the signature.
    Value {
        root: Ident,
        fields: Vec<Member>,
    },
}

/// Checks the arguments against the function; collects every error.
pub(crate) fn check<'a>(args: &'a syn::Result<Args>, func: &'a LockedFn) -> syn::Result<Lock<'a>> {
    // Reported in source order: the attribute's errors, then the function's.
    let mut errors = Errors::default();
    let mut signature_errors = Errors::default();
    let ret = check_signature(&func.sig, &mut signature_errors);
    let lock = match args {
        Ok(args) => {
            if let Some(e) = &args.errors {
                errors.push(e.clone());
            }
            check_args(args, &func.sig, ret, &mut errors)
        }
        Err(e) => {
            errors.push(e.clone());
            None
        }
    };
    errors.append(signature_errors);
    errors.finish()?;
    // A missing part always comes with an error, so this is not reached.
    lock.ok_or_else(|| {
        syn::Error::new(
            Span::call_site(),
            "`#[distributed_lock]` could not read its arguments",
        )
    })
}

fn check_signature<'a>(sig: &'a Signature, errors: &mut Errors) -> Option<&'a Type> {
    let name = &sig.ident;
    if let Some(constness) = &sig.constness {
        errors.push(syn::Error::new(
            constness.span,
            format!(
                "`#[distributed_lock]` cannot go on a `const fn`: taking a lock happens at run time; remove `const` and write `async fn {name}`"
            ),
        ));
    } else if sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            sig.fn_token.span,
            format!(
                "`#[distributed_lock]` needs an `async fn`: the lock is taken, renewed and released around the body's awaits; write `async fn {name}`"
            ),
        ));
    }
    match &sig.output {
        ReturnType::Type(_, ty) => Some(ty),
        ReturnType::Default => {
            errors.push(syn::Error::new(
                sig.paren_token.span.close(),
                format!(
                    "`{name}` returns nothing, but taking the lock can fail: `#[distributed_lock]` needs a return type `Result<T, E>` where `E: From<lock_core::LockError>`, like `-> Result<(), lock_core::LockError>`"
                ),
            ));
            None
        }
    }
}

/// Checks the arguments; `None` when something is wrong (and reported).
/// Errors are pushed in the order the docs list the arguments.
fn check_args<'a>(
    args: &'a Args,
    sig: &Signature,
    ret: Option<&'a Type>,
    errors: &mut Errors,
) -> Option<Lock<'a>> {
    let before = errors.len();
    let keys = check_key_set(args, sig, errors);
    let ttl = args.ttl.as_ref().and_then(|lit| check_ttl(lit, errors));
    let wait = args.wait.as_ref().and_then(|lit| check_wait(lit, errors));
    let forever = matches!(wait, Some(Wait::Forever));
    let min_hold = args
        .min_hold
        .as_ref()
        .and_then(|lit| check_hold("min_hold", lit, errors));
    let max_hold = args
        .max_hold
        .as_ref()
        .and_then(|lit| check_hold("max_hold", lit, errors));
    if let (Some(max), Some(lit)) = (max_hold, args.max_hold.as_ref()) {
        check_max_hold(lit, max, ttl, min_hold, errors);
    }
    let on_lost = args
        .on_lost
        .as_ref()
        .and_then(|lit| check_on_lost(lit, errors));
    let mode = args.mode.as_ref().and_then(|lit| check_mode(lit, errors));
    let permits = args
        .permits
        .as_ref()
        .and_then(|lit| check_permits(lit, errors));
    if forever {
        check_election(args, mode, errors);
    } else {
        check_kind(args, mode, errors);
    }
    let krate = check_crate(args.krate.as_ref(), errors);
    if errors.len() > before {
        return None;
    }
    let ret = ret?;
    let keys = match keys? {
        KeySet::One(key) if forever => KeySet::Election(key),
        keys => keys,
    };
    Some(Lock {
        krate: krate?,
        keys,
        ttl,
        wait: match wait {
            Some(Wait::For(wait)) => Some(wait),
            Some(Wait::Forever) | None => None,
        },
        renew: args.renew.as_ref().map(|b| b.value),
        on_lost,
        fencing: args.fencing.as_ref().map(|b| b.value),
        min_hold,
        max_hold,
        mode,
        permits,
        client: args.client.as_ref(),
        ret,
        ret_nameable: !has_impl_trait(ret),
        error: error_type(ret),
    })
}

/// `key = ".."` or `keys = [..]`: exactly one of them, each template
/// checked against the signature.
fn check_key_set(args: &Args, sig: &Signature, errors: &mut Errors) -> Option<KeySet> {
    let key = args.key.as_ref().map(|lit| check_key(lit, sig, errors));
    let keys = args.keys.as_ref().map(|keys| check_keys(keys, sig, errors));
    match (key, keys) {
        (Some(key), None) => key.map(KeySet::One),
        (None, Some(keys)) => keys.map(KeySet::All),
        (Some(_), Some(_)) => {
            // On the one written second: the first may be what was meant.
            let second = args
                .names
                .iter()
                .filter(|name| *name == "key" || *name == "keys")
                .nth(1);
            let span = second.map_or_else(Span::call_site, Ident::span);
            let message = match second.map(Ident::to_string).as_deref() {
                Some("key") => {
                    "`key` and `keys` exclude each other: `key` names one lock, `keys = [..]` several taken at once; keep one of them, or move this template into the `keys` list"
                }
                _ => {
                    "`keys` and `key` exclude each other: `key` names one lock, `keys = [..]` several taken at once; keep one of them, or move the `key` template into this list"
                }
            };
            errors.push(syn::Error::new(span, message));
            None
        }
        (None, None) => {
            if !args.key_written {
                errors.push(syn::Error::new(
                    Span::call_site(),
                    "`#[distributed_lock]` needs a `key` or `keys`: name the lock, with placeholders for parameters, like `#[distributed_lock(key = \"order:{order_id}\")]`, or several locks to take at once, like `keys = [\"account:{from}\", \"account:{to}\"]`",
                ));
            }
            None
        }
    }
}

/// `keys = [..]`: not empty, no template twice, each checked like `key`.
fn check_keys(keys: &attr::Keys, sig: &Signature, errors: &mut Errors) -> Option<Vec<Key>> {
    if keys.templates.is_empty() {
        errors.push(syn::Error::new(
            keys.brackets,
            "`keys = []` names no lock: list the key templates to take at once, like `keys = [\"account:{from}\", \"account:{to}\"]`",
        ));
        return None;
    }
    let before = errors.len();
    let mut checked = Vec::with_capacity(keys.templates.len());
    for (i, lit) in keys.templates.iter().enumerate() {
        let value = lit.value();
        if keys.templates[..i].iter().any(|seen| seen.value() == value) {
            errors.push(syn::Error::new(
                lit.span(),
                format!(
                    "the template `{}` is in `keys` twice: remove this one",
                    lit.to_token_stream()
                ),
            ));
            continue;
        }
        checked.extend(check_key(lit, sig, errors));
    }
    (errors.len() == before).then_some(checked)
}

/// `mode = ".."`: one of the two choices.
fn check_mode(lit: &LitStr, errors: &mut Errors) -> Option<Mode> {
    match lit.value().as_str() {
        "exclusive" => Some(Mode::Exclusive),
        "shared" => Some(Mode::Shared),
        other => {
            // Words for the same two kinds, from reader-writer locks.
            let meant = match other.to_ascii_lowercase().as_str() {
                "read" | "reader" | "readers" | "shared_read" => Some("shared"),
                "write" | "writer" | "exclusive_write" | "unique" => Some("exclusive"),
                lower => closest(lower, ["exclusive", "shared"]),
            };
            let hint = meant
                .map(|word| format!("did you mean \"{word}\"? "))
                .unwrap_or_default();
            errors.push(syn::Error::new(
                lit.span(),
                format!(
                    "`mode = {}` is not a choice: {hint}write \"exclusive\" (one holder at a time, the default) or \"shared\" (any number of shared holders at once, and no exclusive one meanwhile)",
                    lit.to_token_stream()
                ),
            ));
            None
        }
    }
}

/// `permits = N`: at least 1, and a `u32`.
fn check_permits(lit: &LitInt, errors: &mut Errors) -> Option<u32> {
    let problem = match lit.base10_parse::<u32>() {
        Ok(0) => format!(
            "`permits = {lit}` would let no one take the lock: {PERMITS}; leave it out for one holder at a time"
        ),
        Ok(permits) => return Some(permits),
        Err(_) => format!(
            "`permits = {lit}` is more than {} (`u32::MAX`): {PERMITS}",
            u32::MAX
        ),
    };
    errors.push(syn::Error::new(lit.span(), problem));
    None
}

/// The arguments that choose what kind of lock to take, against each
/// other: `permits` is its own kind, so it goes with no `mode`, and a lock
/// on several keys is exclusive only. At most one error on each argument.
fn check_kind(args: &Args, mode: Option<Mode>, errors: &mut Errors) {
    let named = |text: &str| args.names.iter().find(|name| *name == text);
    let keys = named("keys").is_some();
    if let (Some(Mode::Shared), Some(name), true) = (mode, named("mode"), keys) {
        errors.push(syn::Error::new(
            name.span(),
            "`mode = \"shared\"` cannot go with `keys`: a lock on several keys is exclusive only; remove `mode`, or take each key in its own call",
        ));
    }
    let Some(permits) = named("permits") else {
        return;
    };
    let count = args
        .permits
        .as_ref()
        .map_or_else(|| "N".to_owned(), ToString::to_string);
    let message = match mode {
        Some(Mode::Shared) => format!(
            "`permits` and `mode = \"shared\"` exclude each other: a shared lock admits any number of holders, `permits = {count}` at most {count}; keep one of them"
        ),
        Some(Mode::Exclusive) => format!(
            "`permits` and `mode = \"exclusive\"` exclude each other: an exclusive lock admits one holder, `permits = {count}` at most {count}; keep one of them"
        ),
        None if keys => "`permits` cannot go with `keys`: a lock on several keys is exclusive only; remove `permits`, or take each key in its own call".to_owned(),
        None => return,
    };
    errors.push(syn::Error::new(permits.span(), message));
}

/// `wait = "forever"` against the arguments that a leader cannot have:
/// an election is one key held by one leader, whose term is its fencing
/// token, leading until the body returns. One error on each, on its name.
fn check_election(args: &Args, mode: Option<Mode>, errors: &mut Errors) {
    let shared = mode == Some(Mode::Shared);
    let off = |flag: &Option<syn::LitBool>| flag.as_ref().is_some_and(|b| !b.value);
    // The argument, as the message names it, whether it conflicts as
    // written, and why.
    let conflicts = [
        (
            "keys",
            "`keys`",
            true,
            "an election is one key; use `key`, or give `wait` a duration",
        ),
        (
            "mode",
            "`mode = \"shared\"`",
            shared,
            "a leader holds the key alone; remove `mode`, or give `wait` a duration",
        ),
        (
            "permits",
            "`permits`",
            true,
            "a leader holds the key alone; remove `permits`, or give `wait` a duration",
        ),
        (
            "fencing",
            "`fencing = false`",
            off(&args.fencing),
            "the leader's term is its fencing token, always taken; remove `fencing = false`",
        ),
        (
            "renew",
            "`renew = false`",
            off(&args.renew),
            "the leader's lease is renewed while the body runs; remove `renew = false`, and return from the body to step down",
        ),
        (
            "min_hold",
            "`min_hold`",
            true,
            "the leader resigns when the body returns, so that the next one leads at once; remove `min_hold`",
        ),
        (
            "max_hold",
            "`max_hold`",
            true,
            "the leader leads until the body returns or its lease is lost; remove `max_hold`, and return from the body to end the term (with `tokio::time::timeout`, say)",
        ),
    ];
    for (argument, written, conflicts, why) in conflicts {
        let name = args.names.iter().find(|name| *name == argument);
        if let (Some(name), true) = (name, conflicts) {
            errors.push(syn::Error::new(
                name.span(),
                format!("{written} cannot go with {FOREVER}: {why}"),
            ));
        }
    }
}

/// `ttl = ".."`: a duration, not zero, within lock-core's range.
fn check_ttl(lit: &LitStr, errors: &mut Errors) -> Option<Duration> {
    let ttl = check_duration("ttl", lit, errors)?;
    let shown = restated(lit, ttl);
    let problem = if ttl.is_zero() {
        "is zero: the lease would end as it starts; give it a length like \"30s\"".to_owned()
    } else if ttl < MIN_TTL {
        let min = duration::display(MIN_TTL);
        format!(
            "{shown}is shorter than {min}: renewal runs every ttl/3 and needs a round trip to Redis in that time; use at least \"{min}\" (seconds are typical)"
        )
    } else if ttl > MAX_DURATION {
        format!(
            "{shown}is longer than {}: check the unit; for long work keep a short ttl and let `renew` keep the lock alive",
            duration::display(MAX_DURATION)
        )
    } else {
        return Some(ttl);
    };
    errors.push(syn::Error::new(
        lit.span(),
        format!("`ttl = {}` {problem}", lit.to_token_stream()),
    ));
    None
}

/// `wait = ".."`: a duration within lock-core's range (zero is one
/// attempt), or `"forever"`.
fn check_wait(lit: &LitStr, errors: &mut Errors) -> Option<Wait> {
    let text = lit.value();
    if text == "forever" {
        return Some(Wait::Forever);
    }
    if !text.is_empty() && text.chars().all(char::is_alphabetic) {
        // A word, not a duration: "infinite", "Forever", "never".
        errors.push(syn::Error::new(
            lit.span(),
            format!(
                "`wait = {}` is neither a duration nor \"forever\": write \"forever\" to wait as long as it takes, as a leader election does, or a duration like \"30s\"",
                lit.to_token_stream()
            ),
        ));
        return None;
    }
    let wait = check_duration("wait", lit, errors)?;
    if wait > MAX_DURATION {
        errors.push(syn::Error::new(
            lit.span(),
            format!(
                "`wait = {}` {}is longer than {}: check the unit; `wait = \"0s\"` makes a single attempt",
                lit.to_token_stream(),
                restated(lit, wait),
                duration::display(MAX_DURATION)
            ),
        ));
        return None;
    }
    Some(Wait::For(wait))
}

/// `min_hold = ".."` or `max_hold = ".."`: a duration, not zero, within
/// lock-core's range.
fn check_hold(name: &str, lit: &LitStr, errors: &mut Errors) -> Option<Duration> {
    let hold = check_duration(name, lit, errors)?;
    let problem = if hold.is_zero() {
        "is zero: leave the argument out instead".to_owned()
    } else if hold > MAX_DURATION {
        format!(
            "is longer than {}: check the unit",
            duration::display(MAX_DURATION)
        )
    } else {
        return Some(hold);
    };
    errors.push(syn::Error::new(
        lit.span(),
        format!("`{name} = {}` {problem}", lit.to_token_stream()),
    ));
    None
}

/// `max_hold` (`max`, written as `lit`) against the ttl and `min_hold`.
fn check_max_hold(
    lit: &LitStr,
    max: Duration,
    ttl: Option<Duration>,
    min_hold: Option<Duration>,
    errors: &mut Errors,
) {
    if let Some(ttl) = ttl
        && max < ttl
    {
        errors.push(syn::Error::new(
            lit.span(),
            format!(
                "`max_hold = {}` is shorter than the ttl ({ttl:?}): the lock would end before its first lease; make max_hold at least the ttl",
                lit.to_token_stream()
            ),
        ));
    }
    if let Some(min) = min_hold
        && min > max
    {
        errors.push(syn::Error::new(
            lit.span(),
            format!(
                "`max_hold = {}` is shorter than `min_hold` ({min:?}): the lock cannot be kept at least {min:?} and at most {max:?}",
                lit.to_token_stream()
            ),
        ));
    }
}

/// `on_lost = ".."`: one of the two choices.
fn check_on_lost(lit: &LitStr, errors: &mut Errors) -> Option<OnLost> {
    match lit.value().as_str() {
        "abort" => Some(OnLost::Abort),
        "continue" => Some(OnLost::Continue),
        other => {
            let hint = closest(other, ["abort", "continue"])
                .map(|word| format!("did you mean \"{word}\"? "))
                .unwrap_or_default();
            errors.push(syn::Error::new(
                lit.span(),
                format!(
                    "`on_lost = {}` is not a choice: {hint}write \"abort\" (stop the body at its next await and return the Lost error) or \"continue\" (let the body finish)",
                    lit.to_token_stream()
                ),
            ));
            None
        }
    }
}

/// `crate = ".."`: a path; `::lock_core` without it.
fn check_crate(lit: Option<&LitStr>, errors: &mut Errors) -> Option<Path> {
    let Some(lit) = lit else {
        return Some(syn::parse_quote!(::lock_core));
    };
    match lit.parse::<Path>() {
        Ok(path) => Some(path),
        Err(_) => {
            errors.push(syn::Error::new(
                lit.span(),
                format!(
                    "`crate = {}` is not a path: name lock-core as your Cargo.toml renamed it, like `crate = \"::my_locks\"`",
                    lit.to_token_stream()
                ),
            ));
            None
        }
    }
}

/// `"(1h30m) "` for `"90m"`: the value in canonical form, when it reads
/// differently from what was written.
fn restated(lit: &LitStr, value: Duration) -> String {
    let shown = duration::display(value);
    if shown == lit.value() {
        String::new()
    } else {
        format!("({shown}) ")
    }
}

fn check_duration(name: &str, lit: &LitStr, errors: &mut Errors) -> Option<Duration> {
    match duration::parse(&lit.value()) {
        Ok(value) => Some(value),
        Err(e) => {
            let example = match e {
                DurationError::Empty => "",
                _ => "; for example \"500ms\", \"30s\", \"2m\", \"1h\" or \"1m30s\"",
            };
            errors.push(syn::Error::new(
                lit.span(),
                format!("`{name} = {}` {e}{example}", lit.to_token_stream()),
            ));
            None
        }
    }
}

/// The names a key may use.
struct Params<'a> {
    fn_name: &'a Ident,
    /// `self`, when the function has a receiver.
    receiver: Option<Span>,
    /// Parameters bound to a plain name (`id: u64`, `mut id: u64`).
    named: Vec<&'a Ident>,
    /// Names bound inside a destructuring pattern, with the parameter.
    in_patterns: Vec<(&'a Ident, &'a syn::PatType)>,
}

impl<'a> Params<'a> {
    fn of(sig: &'a Signature) -> Params<'a> {
        let mut params = Params {
            fn_name: &sig.ident,
            receiver: None,
            named: Vec::new(),
            in_patterns: Vec::new(),
        };
        for input in &sig.inputs {
            match input {
                FnArg::Receiver(receiver) => params.receiver = Some(receiver.self_token.span),
                FnArg::Typed(typed) => match &*typed.pat {
                    Pat::Ident(pat) if pat.subpat.is_none() => params.named.push(&pat.ident),
                    Pat::Ident(pat) => {
                        params.named.push(&pat.ident);
                        if let Some((_, sub)) = &pat.subpat {
                            for ident in bindings(sub) {
                                params.in_patterns.push((ident, typed));
                            }
                        }
                    }
                    pat => {
                        for ident in bindings(pat) {
                            params.in_patterns.push((ident, typed));
                        }
                    }
                },
            }
        }
        params
    }

    /// "the parameters are `a`, `b`", or what to do without any.
    fn describe(&self) -> String {
        let mut names: Vec<String> = Vec::new();
        if self.receiver.is_some() {
            names.push("`self`".to_owned());
        }
        names.extend(self.named.iter().map(|ident| format!("`{ident}`")));
        match names.len() {
            0 => format!(
                "`{}` takes no parameters; a key without placeholders names one fixed lock, like `key = \"nightly-report\"`",
                self.fn_name
            ),
            1 => format!("the only parameter is {}", names[0]),
            _ => format!("the parameters are {}", names.join(", ")),
        }
    }
}

/// Every name a pattern binds.
fn bindings(pat: &Pat) -> Vec<&Ident> {
    struct Collect<'a>(Vec<&'a Ident>);
    impl<'a> Visit<'a> for Collect<'a> {
        fn visit_pat_ident(&mut self, pat: &'a syn::PatIdent) {
            self.0.push(&pat.ident);
            syn::visit::visit_pat_ident(self, pat);
        }
    }
    let mut collect = Collect(Vec::new());
    collect.visit_pat(pat);
    collect.0
}

/// How to reach `name` from the value `pat` matches: `["x"]` for
/// `Point { x, .. }`, `["1"]` for `(a, b)` and `b`.
fn path_in_pattern(pat: &Pat, name: &Ident) -> Option<Vec<String>> {
    match pat {
        Pat::Ident(p) if &p.ident == name => Some(Vec::new()),
        Pat::Ident(p) => p
            .subpat
            .as_ref()
            .and_then(|(_, sub)| path_in_pattern(sub, name)),
        Pat::Reference(r) => path_in_pattern(&r.pat, name),
        Pat::Paren(p) => path_in_pattern(&p.pat, name),
        Pat::Type(t) => path_in_pattern(&t.pat, name),
        Pat::Struct(s) => s.fields.iter().find_map(|field| {
            let mut path = vec![member_text(&field.member)];
            path.extend(path_in_pattern(&field.pat, name)?);
            Some(path)
        }),
        Pat::Tuple(t) => elements(t.elems.iter(), name),
        Pat::TupleStruct(t) => elements(t.elems.iter(), name),
        _ => None,
    }
}

fn elements<'a>(elems: impl Iterator<Item = &'a Pat>, name: &Ident) -> Option<Vec<String>> {
    let mut elems = elems.enumerate();
    elems.find_map(|(i, elem)| {
        if matches!(elem, Pat::Rest(_)) {
            return None;
        }
        let mut path = vec![i.to_string()];
        path.extend(path_in_pattern(elem, name)?);
        Some(path)
    })
}

fn member_text(member: &Member) -> String {
    match member {
        Member::Named(ident) => ident.to_string(),
        Member::Unnamed(index) => index.index.to_string(),
    }
}

/// A name for a parameter of type `ty`: `point` for `Point`.
fn name_for(ty: &Type) -> String {
    let last = match ty {
        Type::Path(path) => path.path.segments.last().map(|s| s.ident.to_string()),
        Type::Reference(r) => return name_for(&r.elem),
        _ => None,
    };
    let Some(last) = last else {
        return "value".to_owned();
    };
    let mut out = String::new();
    for (i, c) in last.chars().enumerate() {
        if c.is_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.extend(c.to_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

fn check_key(lit: &LitStr, sig: &Signature, errors: &mut Errors) -> Option<Key> {
    let params = Params::of(sig);
    let span = lit.span();
    let template = match template::parse(&lit.value()) {
        Ok(template) => template,
        Err(e) => {
            let message = match e {
                TemplateError::EmptyPlaceholder | TemplateError::Positional { .. } => {
                    format!("{e}; {}", params.describe())
                }
                _ => e.to_string(),
            };
            errors.push(syn::Error::new(span, message));
            return None;
        }
    };
    let mut parts = Vec::with_capacity(template.segments.len());
    let before = errors.len();
    for segment in template.segments {
        let placeholder = match segment {
            Segment::Text(text) => {
                parts.push(KeyPart::Text(text));
                continue;
            }
            Segment::Value(placeholder) => placeholder,
        };
        let root = match resolve_root(&placeholder, &params, span) {
            Ok(root) => root,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        // A field that does not exist is rustc's error (E0609, "no field
        // `m` on type `Svc`"), shown on the key literal. Its fix-it
        // ("a field with a similar name exists") would replace the span of
        // the field's name, here the whole literal, with a bare field name,
        // which no longer compiles. Mixed-site hygiene keeps rustc from
        // offering fields to a name the macro wrote (fields resolve by
        // name alone, privacy as at the call site), and `located_at` keeps
        // the error on the literal.
        let field_span = Span::mixed_site().located_at(span);
        let fields = placeholder
            .fields
            .into_iter()
            .map(|member| match member {
                Member::Named(mut ident) => {
                    ident.set_span(field_span);
                    Member::Named(ident)
                }
                Member::Unnamed(mut index) => {
                    index.span = field_span;
                    Member::Unnamed(index)
                }
            })
            .collect();
        parts.push(KeyPart::Value { root, fields });
    }
    (errors.len() == before).then_some(Key { span, parts })
}

/// The parameter (or `self`) a placeholder starts from, spanned on the key
/// literal `span` but resolved where the parameter is declared.
fn resolve_root(placeholder: &Placeholder, params: &Params<'_>, span: Span) -> syn::Result<Ident> {
    let name = match &placeholder.root {
        Root::SelfValue => {
            return match params.receiver {
                Some(self_span) => Ok(Ident::new("self", span.resolved_at(self_span))),
                None => Err(syn::Error::new(
                    span,
                    format!(
                        "the lock key uses `{{{}}}`, but `{}` has no `self` parameter; {}",
                        placeholder.text,
                        params.fn_name,
                        params.describe()
                    ),
                )),
            };
        }
        Root::Name(name) => name,
    };
    if let Some(param) = params.named.iter().find(|ident| **ident == name) {
        let mut root = (*param).clone();
        root.set_span(span.resolved_at(param.span()));
        return Ok(root);
    }
    if let Some((_, typed)) = params.in_patterns.iter().find(|(ident, _)| *ident == name) {
        return Err(pattern_bound(&placeholder.text, name, typed, span));
    }
    if params.receiver.is_none() && params.named.is_empty() {
        return Err(syn::Error::new(
            span,
            format!(
                "unknown placeholder `{{{}}}` in the lock key: {}",
                placeholder.text,
                params.describe()
            ),
        ));
    }
    let candidates = params
        .named
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>();
    let hint = closest(&name.to_string(), candidates.iter().map(String::as_str))
        .map(|c| format!("did you mean `{{{c}}}`? "))
        .unwrap_or_default();
    Err(syn::Error::new(
        span,
        format!(
            "unknown placeholder `{{{}}}` in the lock key: `{}` has no parameter `{name}`; {hint}{}",
            placeholder.text,
            params.fn_name,
            params.describe()
        ),
    ))
}

fn pattern_bound(text: &str, name: &Ident, typed: &syn::PatType, span: Span) -> syn::Error {
    let param = name_for(&typed.ty);
    let mut path = vec![param.clone()];
    path.extend(path_in_pattern(&typed.pat, name).unwrap_or_default());
    let rest = text.split_once('.').map(|(_, rest)| rest);
    path.extend(rest.map(str::to_owned));
    syn::Error::new(
        span,
        format!(
            "the lock key uses `{{{text}}}`, but `{name}` is bound inside the pattern `{}`; the key reads parameters by name: bind this parameter to a name, like `{param}: {}`, and write `{{{}}}`",
            squeeze(&typed.pat.to_token_stream().to_string()),
            squeeze(&typed.ty.to_token_stream().to_string()),
            path.join(".")
        ),
    )
}

/// Token text as a person writes it: `Point { x, y }`, `&(a, b)`.
fn squeeze(tokens: &str) -> String {
    tokens
        .replace("& ", "&")
        .replace(" ,", ",")
        .replace("( ", "(")
        .replace(" )", ")")
        .replace(" :: ", "::")
        .replace(" < ", "<")
        .replace(" <", "<")
        .replace(" >", ">")
}

/// `E` in `Result<T, E>`, `std::result::Result<T, E>`: the error type as
/// the signature spells it, unless it holds an `impl Trait`.
fn error_type(ret: &Type) -> Option<&Type> {
    let Type::Path(path) = ret else {
        return None;
    };
    let last = path.path.segments.last()?;
    if path.qself.is_some() || last.ident != "Result" {
        return None;
    }
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    let mut types = args.args.iter().filter_map(|arg| match arg {
        syn::GenericArgument::Type(ty) => Some(ty),
        _ => None,
    });
    match (types.next(), types.next(), types.next()) {
        (Some(_), Some(error), None) if !has_impl_trait(error) => Some(error),
        _ => None,
    }
}

fn has_impl_trait(ty: &Type) -> bool {
    struct Find(bool);
    impl Visit<'_> for Find {
        fn visit_type_impl_trait(&mut self, _: &syn::TypeImplTrait) {
            self.0 = true;
        }
    }
    let mut find = Find(false);
    find.visit_type(ty);
    find.0
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn paths_through_patterns() {
        let pat: Pat = syn::parse_quote!(Point { x, y: (a, b) });
        let b: Ident = syn::parse_quote!(b);
        assert_eq!(
            path_in_pattern(&pat, &b),
            Some(vec!["y".into(), "1".into()])
        );
        let ty: Type = syn::parse_quote!(&GeoPoint);
        assert_eq!(name_for(&ty), "geo_point");
    }

    #[test]
    fn permits_range_from_one_to_u32_max() {
        let check = |lit: LitInt| {
            let mut errors = Errors::default();
            check_permits(&lit, &mut errors)
        };
        assert_eq!(check(syn::parse_quote!(1)), Some(1));
        assert_eq!(check(syn::parse_quote!(4294967295)), Some(u32::MAX));
        assert_eq!(check(syn::parse_quote!(3u32)), Some(3));
        assert_eq!(check(syn::parse_quote!(0)), None);
        assert_eq!(check(syn::parse_quote!(4294967296)), None);
    }
}
