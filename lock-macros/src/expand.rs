//! Code generation. It cannot fail: `valid.rs` has checked and resolved
//! everything it reads.

use crate::attr::LockedFn;
use crate::valid::{Key, KeyPart, KeySet, Lock, Mode, OnLost};
use proc_macro2::{Delimiter, Group, Span, TokenStream, TokenTree};
use quote::{ToTokens, quote, quote_spanned};
use syn::LitStr;
use syn::spanned::Spanned;

/// Wraps the function's body in a lock.
///
/// The signature stays as written. The key is rendered first, from borrowed
/// parameters, so the body may move them; the client named by `client = ..`
/// is cloned (one reference count) for the same reason. The body becomes an
/// `async move` block whose value is pinned to the declared return type, so
/// `?` and `return` inside it convert into the function's error type as
/// they did before. lock-core's `run` does the rest: it is
/// `LockClient::run_locked`, the public combinator (acquire, renew, watch
/// for loss, release on every exit path), with the attribute's arguments
/// as its `RunOptions` and its `LockError` converted into the function's
/// error type.
///
/// The body goes to `run` boxed. It holds every annotated call nested in
/// it, and in an unoptimised build each poll frame around it reserves its
/// size again: three nested calls needed 1.4 MB of a 2 MB thread stack with
/// the body inline, 0.1 MB boxed. One allocation per call buys that.
///
/// The body's value and `run`'s result pass through `LockResult`'s identity
/// conversions, and everything generated around the body is spanned on the
/// return type: a return type that is not a `Result` gets one error there
/// (`LockResult`'s), and the conversions keep it from cascading into
/// mismatches in every expression that follows. The error type's
/// conversion from `LockError` is a function `run` is handed, named with
/// the error type's own span (see [`into_error`]): an error type without
/// `From<LockError>` gets one error, on that type. Each message is the
/// trait's `#[diagnostic::on_unimplemented]`.
///
/// Input:
///
/// ```text
/// #[distributed_lock(key = "order:{order_id}", ttl = "30s")]
/// pub async fn charge(order_id: u64, amount: Cents) -> Result<Receipt, BillingError> {
///     let receipt = gateway.charge(order_id, amount).await?;
///     Ok(receipt)
/// }
/// ```
///
/// Output:
///
/// ```text
/// pub async fn charge(order_id: u64, amount: Cents) -> Result<Receipt, BillingError> {
///     let __lock_attr_key = ::std::format!("order:{}", order_id);
///     let __lock_attr_client = ::lock_core::__private::global();
///     ::lock_core::__private::LockResult::from_result(
///         ::lock_core::__private::run(
///             __lock_attr_client,
///             __lock_attr_key,
///             ::lock_core::__private::Attr {
///                 ttl: ::core::option::Option::Some(::core::time::Duration::from_millis(30000u64)),
///                 label: "order:{order_id}",
///                 ..::lock_core::__private::Attr::DEFAULT
///             },
///             <BillingError as ::lock_core::__private::FromLockError>::from_lock_error,
///             ::std::boxed::Box::pin(async move {
///                 let __lock_attr_ret: Result<Receipt, BillingError> = {
///                     let receipt = gateway.charge(order_id, amount).await?;
///                     Ok(receipt)
///                 };
///                 #[allow(unreachable_code)]
///                 ::lock_core::__private::LockResult::into_result(__lock_attr_ret)
///             }),
///         )
///         .await,
///     )
/// }
/// ```
///
/// With `client = self.locks` the client line becomes
///
/// ```text
/// let __lock_attr_client = ::lock_core::__private::client(&(self.locks)).cloned();
/// let __lock_attr_client = match __lock_attr_client {
///     ::core::result::Result::Ok(ref client) => ::core::result::Result::Ok(client),
///     ::core::result::Result::Err(e) => ::core::result::Result::Err(e),
/// };
/// ```
///
/// With `keys = ["account:{from}", "account:{to}"]` the key line becomes
///
/// ```text
/// let __lock_attr_keys = ::std::vec![
///     ::std::format!("account:{}", from),
///     ::std::format!("account:{}", to),
/// ];
/// ```
///
/// and `run_all(__lock_attr_client, __lock_attr_keys, ..)` takes the place
/// of `run(__lock_attr_client, __lock_attr_key, ..)`: every template is
/// rendered, in the order written, and lock-core sorts them and collapses
/// duplicates. With `wait = "forever"`, `lead(__lock_attr_client,
/// __lock_attr_key, ..)` takes the place of `run(..)`: it campaigns for the
/// key and runs the body as its leader; the `Attr` has no `wait` then.
/// `mode = "shared"` and `permits = 3` are fields of the `Attr`
/// like the others: `mode: ::lock_core::__private::Mode::Shared`,
/// `permits: ::core::option::Option::Some(3u32)`.
///
/// When the return type holds an `impl Trait`, which cannot be written
/// inside the body, the conversions and the `__lock_attr_ret` line are left
/// out: the body's type is inferred from `run`'s, whose bounds still
/// require a `Result` whose error converts from `LockError`.
pub(crate) fn expand(func: &LockedFn, lock: &Lock<'_>) -> TokenStream {
    let LockedFn {
        attrs,
        vis,
        sig,
        body,
    } = func;
    let ret = lock.ret;
    let inner_attrs = &body.inner_attrs;
    let mut block = Group::new(Delimiter::Brace, body.stmts.clone());
    block.set_span(body.brace);

    let (keys, key, run) = match &lock.keys {
        KeySet::One(key) => (quote! { __lock_attr_key }, render_key(key), quote! { run }),
        KeySet::Election(key) => (quote! { __lock_attr_key }, render_key(key), quote! { lead }),
        KeySet::All(keys) => {
            let keys = keys.iter().map(render_key);
            (
                quote! { __lock_attr_keys },
                quote! { ::std::vec![#(#keys),*] },
                quote! { run_all },
            )
        }
    };
    let client = client(lock);
    let attr = attr(lock);
    let into_error = into_error(lock);
    let call = if lock.ret_nameable {
        // Everything generated around the body is spanned on the return
        // type (its first token: a proc macro cannot join spans on stable),
        // so that each failed bound is reported there, and only once.
        let span = ret.span();
        let krate = respan(lock.krate.to_token_stream(), span);
        let body = quote_spanned! {span=>
            async move {
                let __lock_attr_ret: #ret = #block;
                #[allow(unreachable_code)]
                #krate::__private::LockResult::into_result(__lock_attr_ret)
            }
        };
        let args =
            quote! { __lock_attr_client, #keys, #attr, #into_error, ::std::boxed::Box::pin(#body) };
        let run = respan(run, span);
        quote_spanned! {span=>
            #krate::__private::LockResult::from_result(#krate::__private::#run(#args).await)
        }
    } else {
        let krate = &lock.krate;
        quote! {
            #krate::__private::#run(
                __lock_attr_client,
                #keys,
                #attr,
                #into_error,
                ::std::boxed::Box::pin(async move #block),
            )
            .await
        }
    };
    quote! {
        #(#attrs)*
        #vis #sig {
            #(#inner_attrs)*
            let #keys = #key;
            #client
            #call
        }
    }
}

/// `::std::format!("order:{}", order_id)`, with every value spanned on the
/// key literal: a value without `Display` is reported there.
fn render_key(key: &Key) -> TokenStream {
    let mut format = String::new();
    let mut values = Vec::new();
    for part in &key.parts {
        match part {
            KeyPart::Text(text) => {
                format.push_str(&text.replace('{', "{{").replace('}', "}}"));
            }
            KeyPart::Value { root, fields } => {
                format.push_str("{}");
                values.push(quote_spanned! {key.span=> #root #(.#fields)* });
            }
        }
    }
    let format = LitStr::new(&format, key.span);
    quote_spanned! {key.span=> ::std::format!(#format #(, #values)*) }
}

/// `<E as FromLockError>::from_lock_error`, the conversion `run` returns
/// every lock error through, spanned on the declared error type `E`: an
/// error type without `From<LockError>` is reported there, once, in the
/// words of `FromLockError`'s `#[diagnostic::on_unimplemented]`. When the
/// signature does not spell `E` (`io::Result<()>`, an alias), `_` in its
/// place is inferred from the body, and the error is on the return type.
fn into_error(lock: &Lock<'_>) -> TokenStream {
    let krate = &lock.krate;
    match lock.error {
        Some(error) => {
            let span = error.span();
            let conversion = respan(quote! { #krate::__private::FromLockError }, span);
            quote_spanned! {span=> <#error as #conversion>::from_lock_error }
        }
        None => respan(
            quote! { <_ as #krate::__private::FromLockError>::from_lock_error },
            lock.ret.span(),
        ),
    }
}

/// Binds `__lock_attr_client`: the global client, or the one `client = ..`
/// names. The latter is cloned so the body may move what it came from
/// (`self: Arc<Self>`, `&mut self`).
fn client(lock: &Lock<'_>) -> TokenStream {
    let krate = &lock.krate;
    match lock.client {
        None => quote! {
            let __lock_attr_client = #krate::__private::global();
        },
        Some(expr) => {
            let lookup = quote_spanned! {expr.span()=>
                #krate::__private::client(&(#expr))
            };
            quote! {
                let __lock_attr_client = #lookup.cloned();
                let __lock_attr_client = match __lock_attr_client {
                    ::core::result::Result::Ok(ref __lock_attr_c) => ::core::result::Result::Ok(__lock_attr_c),
                    ::core::result::Result::Err(__lock_attr_e) => ::core::result::Result::Err(__lock_attr_e),
                };
            }
        }
    }
}

/// The `Attr` constant: the arguments given, the defaults for the rest.
fn attr(lock: &Lock<'_>) -> TokenStream {
    let krate = &lock.krate;
    let millis = |duration: std::time::Duration| {
        let ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        quote! {
            ::core::option::Option::Some(::core::time::Duration::from_millis(#ms))
        }
    };
    let mut fields = Vec::new();
    if let Some(ttl) = lock.ttl {
        let value = millis(ttl);
        fields.push(quote! { ttl: #value });
    }
    if let Some(wait) = lock.wait {
        let value = millis(wait);
        fields.push(quote! { wait: #value });
    }
    if let Some(renew) = lock.renew {
        fields.push(quote! { renew: #renew });
    }
    if let Some(on_lost) = lock.on_lost {
        let variant = match on_lost {
            OnLost::Abort => quote! { Abort },
            OnLost::Continue => quote! { Continue },
        };
        fields.push(quote! { on_lost: #krate::__private::OnLost::#variant });
    }
    if let Some(fencing) = lock.fencing {
        fields.push(quote! { fencing: #fencing });
    }
    if let Some(min_hold) = lock.min_hold {
        let value = millis(min_hold);
        fields.push(quote! { min_hold: #value });
    }
    if let Some(max_hold) = lock.max_hold {
        let value = millis(max_hold);
        fields.push(quote! { max_hold: #value });
    }
    if let Some(mode) = lock.mode {
        let variant = match mode {
            Mode::Exclusive => quote! { Exclusive },
            Mode::Shared => quote! { Shared },
        };
        fields.push(quote! { mode: #krate::__private::Mode::#variant });
    }
    if let Some(permits) = lock.permits {
        fields.push(quote! { permits: ::core::option::Option::Some(#permits) });
    }
    let label = LitStr::new(&label(&lock.keys), Span::call_site());
    fields.push(quote! { label: #label });
    quote! {
        #krate::__private::Attr {
            #(#fields,)*
            ..#krate::__private::Attr::DEFAULT
        }
    }
}

/// The metrics label: the key template as written, `{{`/`}}` escapes
/// included; for `keys = [..]`, the templates joined by `,`. Known at
/// compile time, so a lock's series are as many as its templates, whatever
/// the values.
fn label(keys: &KeySet) -> String {
    let template = |key: &Key| {
        let mut text = String::new();
        for part in &key.parts {
            match part {
                KeyPart::Text(t) => text.push_str(&t.replace('{', "{{").replace('}', "}}")),
                KeyPart::Value { root, fields } => {
                    text.push('{');
                    text.push_str(&root.to_string());
                    for field in fields {
                        text.push('.');
                        text.push_str(&field.to_token_stream().to_string());
                    }
                    text.push('}');
                }
            }
        }
        text
    };
    match keys {
        KeySet::One(key) | KeySet::Election(key) => template(key),
        KeySet::All(keys) => keys.iter().map(template).collect::<Vec<_>>().join(","),
    }
}

/// `tokens` with every span set to `span`.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            if let TokenTree::Group(group) = &token {
                let mut inner = Group::new(group.delimiter(), respan(group.stream(), span));
                inner.set_span(span);
                token = TokenTree::Group(inner);
            } else {
                token.set_span(span);
            }
            token
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::attr::Args;
    use proc_macro2::TokenStream;

    fn expand_str(args: TokenStream, item: TokenStream) -> String {
        let args = syn::parse2::<Args>(args);
        let func = syn::parse2::<LockedFn>(item).unwrap();
        let lock = crate::valid::check(&args, &func).unwrap();
        expand(&func, &lock).to_string()
    }

    fn words(text: &str) -> impl Iterator<Item = &str> {
        text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .filter(|word| !word.is_empty())
    }

    /// Every word of the expansion that the user did not write.
    fn generated_idents(expanded: &str, user: &str) -> Vec<String> {
        let user: Vec<&str> = words(user).collect();
        words(expanded)
            .filter(|word| !user.contains(word))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn generated_names_are_prefixed_and_paths_absolute() {
        let item = quote! {
            pub async fn charge(order_id: u64, amount: u64) -> Result<u64, BillingError> {
                let charged = pay(order_id, amount).await?;
                Ok(charged)
            }
        };
        let expanded = expand_str(
            quote!(
                key = "order:{order_id}",
                ttl = "1m30s",
                on_lost = "continue"
            ),
            item.clone(),
        );
        let user = item.to_string();
        let words = generated_idents(&expanded, &user);
        let allowed = [
            "lock_core",
            "__private",
            "run",
            "global",
            "Attr",
            "DEFAULT",
            "ttl",
            "on_lost",
            "OnLost",
            "Continue",
            "core",
            "option",
            "Option",
            "Some",
            "time",
            "Duration",
            "from_millis",
            "90000u64",
            "std",
            "format",
            "boxed",
            "Box",
            "pin",
            "LockResult",
            "into_result",
            "from_result",
            "FromLockError",
            "from_lock_error",
            "as",
            "allow",
            "unreachable_code",
            "move",
            "label",
            // The text of the format string.
            "order",
        ];
        for word in &words {
            assert!(
                word.starts_with("__lock_attr_") || allowed.contains(&word.as_str()),
                "unexpected generated name `{word}` in {expanded}"
            );
        }
        // Each crate path starts from the root: `:: lock_core :: ..`.
        let spaced = expanded.replace(['(', '[', '{'], "( ");
        let tokens: Vec<&str> = spaced.split_whitespace().collect();
        for (i, token) in tokens.iter().enumerate() {
            if ["lock_core", "core", "std"].contains(token) && tokens.get(i + 1) == Some(&"::") {
                assert_eq!(tokens[i - 1], "::", "`{token}` without a leading `::`");
            }
        }
        assert!(
            expanded.contains("format ! (\"order:{}\" , order_id)"),
            "{expanded}"
        );
        assert!(expanded.contains("from_millis (90000u64)"), "{expanded}");
    }

    #[test]
    fn crate_argument_replaces_every_lock_core_path() {
        let expanded = expand_str(
            quote!(key = "job", crate = "::locks", client = self.locks),
            quote! {
                async fn job(&self) -> Result<(), locks::LockError> { Ok(()) }
            },
        );
        assert!(!expanded.contains("lock_core"), "{expanded}");
        assert!(
            expanded.contains(":: locks :: __private :: client"),
            "{expanded}"
        );
        assert!(
            expanded.contains(":: locks :: __private :: run"),
            "{expanded}"
        );
    }

    #[test]
    fn keys_render_every_template_in_order_and_call_run_all() {
        let expanded = expand_str(
            quote!(keys = ["account:{to}", "account:{from}"], fencing = true),
            quote! { async fn transfer(from: u64, to: u64) -> Result<(), E> { Ok(()) } },
        );
        assert!(
            expanded.contains(
                "let __lock_attr_keys = :: std :: vec ! [:: std :: format ! (\"account:{}\" , to) , :: std :: format ! (\"account:{}\" , from)]"
            ),
            "{expanded}"
        );
        assert!(
            expanded.contains(
                ":: lock_core :: __private :: run_all (__lock_attr_client , __lock_attr_keys ,"
            ),
            "{expanded}"
        );
        assert!(!expanded.contains("__lock_attr_key "), "{expanded}");
    }

    #[test]
    fn mode_and_permits_are_fields_of_the_attr() {
        let shared = expand_str(
            quote!(key = "catalog", mode = "shared"),
            quote! { async fn read() -> Result<(), E> { Ok(()) } },
        );
        assert!(
            shared.contains("mode : :: lock_core :: __private :: Mode :: Shared"),
            "{shared}"
        );
        assert!(!shared.contains("permits"), "{shared}");
        let permits = expand_str(
            quote!(key = "pool", permits = 3),
            quote! { async fn export() -> Result<(), E> { Ok(()) } },
        );
        assert!(
            permits.contains("permits : :: core :: option :: Option :: Some (3u32)"),
            "{permits}"
        );
        assert!(!permits.contains("mode"), "{permits}");
    }

    #[test]
    fn wait_forever_calls_lead_without_a_wait() {
        let expanded = expand_str(
            quote!(key = "scheduler:{region}", wait = "forever", ttl = "10s"),
            quote! { async fn schedule(region: u32) -> Result<u64, E> { Ok(1) } },
        );
        assert!(
            expanded.contains(
                ":: lock_core :: __private :: lead (__lock_attr_client , __lock_attr_key ,"
            ),
            "{expanded}"
        );
        assert!(!expanded.contains("wait :"), "{expanded}");
        assert!(
            expanded.contains("label : \"scheduler:{region}\""),
            "{expanded}"
        );
    }

    #[test]
    fn the_label_is_the_template_as_written() {
        let one = expand_str(
            quote!(key = "order:{order.id}:{{raw}}"),
            quote! { async fn f(order: Order) -> Result<(), E> { Ok(()) } },
        );
        assert!(
            one.contains("label : \"order:{order.id}:{{raw}}\""),
            "{one}"
        );
        let all = expand_str(
            quote!(keys = ["account:{to}", "account:{from}"]),
            quote! { async fn transfer(from: u64, to: u64) -> Result<(), E> { Ok(()) } },
        );
        assert!(
            all.contains("label : \"account:{to},account:{from}\""),
            "{all}"
        );
    }

    #[test]
    fn literal_braces_stay_literal_in_the_format_string() {
        let expanded = expand_str(
            quote!(key = "{{raw}}:{id}"),
            quote! { async fn f(id: u32) -> Result<(), E> { Ok(()) } },
        );
        assert!(expanded.contains("\"{{raw}}:{}\""), "{expanded}");
    }
}
