//! The `#[distributed_lock]` attribute for [lock-core]: run an async
//! function only while this process holds a distributed lock, with the key
//! checked at compile time and the lock released on every exit path.
//!
//! Depend on `lock-core` and use the attribute through it
//! (`lock_core::distributed_lock`, default feature `macros`); this crate is
//! its implementation. See [`macro@distributed_lock`] for the arguments.
//!
//! ```
//! use lock_core::{LockClient, LockError, distributed_lock};
//!
//! #[distributed_lock(key = "order:{order_id}", ttl = "30s")]
//! async fn charge(order_id: u64, cents: u64) -> Result<u64, LockError> {
//!     // Runs only while this process holds `order:<order_id>` across the
//!     // fleet; renewed while it runs, released however it ends.
//!     Ok(cents)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // At startup; in production `LockClient::builder().url("redis://host:6379").build().await?`.
//! lock_core::set_global_client(LockClient::in_memory())?;
//! assert_eq!(charge(42, 1999).await?, 1999);
//! # Ok(()) }
//! ```
//!
//! How it is built, as a pipeline in which each module imports only those
//! listed before it: `errors.rs` collects the errors and suggests the name
//! meant; `limits.rs` holds lock-core's ranges; `duration.rs` and
//! `template.rs` read the duration strings and the key template;
//! `attr.rs` parses the arguments and the function; `valid.rs` checks
//! everything against the signature, reporting each mistake on its token;
//! `expand.rs` generates the code and cannot fail (see its Input/Output
//! comment).
//!
//! [lock-core]: https://docs.rs/lock-core
#![warn(missing_docs)]

mod attr;
mod duration;
mod errors;
mod expand;
mod limits;
mod template;
mod valid;

use proc_macro::TokenStream;

/// Runs an `async fn` only while this process holds a distributed lock.
///
/// ```
/// use lock_core::{LockClient, LockError, distributed_lock};
///
/// /// The application's error: lock errors come back through it.
/// #[derive(Debug)]
/// enum BillingError {
///     Lock(LockError),
///     Declined,
/// }
///
/// impl From<LockError> for BillingError {
///     fn from(e: LockError) -> Self {
///         BillingError::Lock(e)
///     }
/// }
///
/// #[distributed_lock(key = "order:{order_id}", ttl = "30s")]
/// async fn charge(order_id: u64, cents: u64) -> Result<u64, BillingError> {
///     if cents == 0 {
///         return Err(BillingError::Declined);
///     }
///     Ok(cents)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # lock_core::with_default_client(LockClient::in_memory(), async {
/// assert_eq!(charge(42, 1999).await.unwrap(), 1999);
/// assert!(matches!(charge(42, 0).await, Err(BillingError::Declined)));
/// # }).await }
/// ```
///
/// The lock is taken before the body starts (waiting as long as `wait`
/// says), renewed while the body runs, and released however the body ends.
/// Inside the body, [`lock_core::current_lock()`] describes the lock: its
/// rendered key (or keys) and, with `fencing = true`, its fencing token.
///
/// The function must be an `async fn` returning `Result<T, E>` where
/// `E: From<lock_core::LockError>`: when the lock cannot be taken (held
/// elsewhere for the whole wait, Redis unreachable) or is lost while the
/// body runs, the function returns that error, converted into `E`.
///
/// Arguments are `name = value`, in any order, each at most once. Exactly
/// one of `key` and `keys` is required.
///
/// | argument | value | default |
/// | --- | --- | --- |
/// | [`key`](#key) | string template | required, or `keys` |
/// | [`keys`](#keys) | list of string templates | required, or `key` |
/// | [`ttl`](#ttl) | duration string | the client's default ttl |
/// | [`wait`](#wait) | duration string, or [`"forever"`](#wait--forever-leader-election) | the client's default wait |
/// | [`renew`](#renew) | `true` / `false` | `true` |
/// | [`on_lost`](#on_lost) | `"abort"` / `"continue"` | `"abort"` |
/// | [`fencing`](#fencing) | `true` / `false` | `false` |
/// | [`min_hold`](#min_hold) | duration string | none |
/// | [`max_hold`](#max_hold) | duration string, at least the ttl | none |
/// | [`mode`](#mode) | `"exclusive"` / `"shared"` | `"exclusive"` |
/// | [`permits`](#permits) | integer, at least 1 | none |
/// | [`client`](#client) | expression | the global client |
/// | [`crate`](#crate) | string path | `"::lock_core"` |
///
/// # `key`
///
/// The lock's name: literal text plus placeholders `{name}` or
/// `{name.field.sub}`, where `name` is a parameter of the function or
/// `self`. The value is formatted with `Display`. `{{` and `}}` are literal
/// braces. Placeholders are checked at compile time: a name that is not a
/// parameter, an unbalanced brace, an empty key or an empty placeholder is
/// an error on the key, and so is a value whose type is not `Display`.
///
/// ```
/// use lock_core::{LockClient, LockError, distributed_lock};
///
/// pub struct Customer {
///     pub id: u64,
/// }
///
/// #[distributed_lock(key = "invoice:{customer.id}:{month}")]
/// async fn bill(customer: &Customer, month: u8) -> Result<String, LockError> {
///     Ok(lock_core::current_lock().unwrap().key().to_owned())
/// }
///
/// pub struct Tenant {
///     id: u32,
///     locks: LockClient,
/// }
///
/// impl Tenant {
///     #[distributed_lock(key = "tenant:{self.id}:reindex", client = self.locks)]
///     async fn reindex(&self) -> Result<(), LockError> {
///         Ok(())
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// # lock_core::with_default_client(LockClient::in_memory(), async {
/// assert_eq!(bill(&Customer { id: 7 }, 3).await?, "invoice:7:3");
/// let tenant = Tenant { id: 1, locks: LockClient::in_memory() };
/// tenant.reindex().await?;
/// # Ok(()) }).await }
/// ```
///
/// A parameter bound by a destructuring pattern (`Point { x, y }: Point`)
/// cannot be used: bind it to a name (`point: Point`) and write
/// `{point.x}`.
///
/// The key is rendered once, before the body starts, from borrowed
/// parameters, so the body may still move them.
///
/// # `keys`
///
/// Several locks taken at once, all or nothing, for work that touches
/// several resources: each element is a key template checked like `key`'s.
/// The keys are taken in one canonical order (sorted, a key rendered twice
/// taken once), so two calls naming the same keys in opposite orders never
/// deadlock; the lock is renewed as a whole and counts as lost when any of
/// its keys is lost.
///
/// ```
/// # use lock_core::{LockClient, LockError, distributed_lock};
/// #[distributed_lock(keys = ["account:{from}", "account:{to}"])]
/// async fn transfer(from: u64, to: u64) -> Result<Vec<String>, LockError> {
///     // Runs while this process holds both `account:<from>` and `account:<to>`.
///     let lock = lock_core::current_lock().unwrap();
///     Ok(lock.keys().map(str::to_owned).collect())
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// # lock_core::with_default_client(LockClient::in_memory(), async {
///
/// // Taken in one sorted order, whichever order the caller names them in.
/// assert_eq!(transfer(7, 3).await?, ["account:3", "account:7"]);
/// # Ok(()) }).await }
/// ```
///
/// Inside the body, `current_lock()`'s `keys()` gives every key held in
/// that order (one when `from == to`), `key()` the first of them, and with
/// `fencing = true` `fencing_token_of(key)` each key's own token. `key` and
/// `keys` exclude each other; the list may not be empty or name a template
/// twice. A lock on several keys is exclusive only: `keys` goes with
/// neither `mode = "shared"` nor `permits`.
///
/// # `ttl`
///
/// How long the lease lasts without renewal: `"500ms"`, `"30s"`, `"2m"`,
/// `"1h"`, or a sum from the largest unit down like `"1m30s"`. Between 10ms
/// and 24h. While the body runs the lease is renewed every ttl/3, so the
/// ttl bounds how long the lock outlives a crashed holder, not how long the
/// body may run.
///
/// ```
/// # use lock_core::{LockClient, LockError, distributed_lock};
/// #[distributed_lock(key = "report:{day}", ttl = "2m")]
/// async fn build_report(day: u32) -> Result<u32, LockError> {
///     // Renewed every 40s while it runs, however long that is.
///     Ok(day)
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// # lock_core::with_default_client(LockClient::in_memory(), async {
/// # assert_eq!(build_report(14).await?, 14);
/// # Ok(()) }).await }
/// ```
///
/// # `wait`
///
/// How long to wait for a lock held elsewhere before giving up with a
/// `Contended` error; `"0s"` makes a single attempt, for work that only one
/// replica should do and the others skip. At most 24h; `"forever"` makes
/// the function a leader election (next section).
///
/// ```
/// use lock_core::{LockClient, LockError, MemoryStore, distributed_lock};
/// use std::time::Duration;
///
/// #[distributed_lock(key = "cron:cleanup", wait = "0s")]
/// async fn cleanup() -> Result<(), LockError> {
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// let store = MemoryStore::new();
/// let other_replica = LockClient::in_memory_on(&store);
/// let held = other_replica.lock("cron:cleanup", Duration::from_secs(30)).await?;
/// # lock_core::with_default_client(LockClient::in_memory_on(&store), async {
/// // Another replica runs it now: this one skips the tick at once.
/// let err = cleanup().await.unwrap_err();
/// assert!(err.is_contended(), "{err}");
/// # Ok::<(), LockError>(()) }).await?;
/// held.release().await?;
/// # Ok(()) }
/// ```
///
/// # `wait = "forever"`: leader election
///
/// Runs the function only on the leader: it **campaigns** for the key,
/// waiting as long as it takes until no other process holds it, as
/// [`LockClient::campaign`] does, and runs the body once as the leader.
/// Another replica calling it meanwhile waits its turn and runs the
/// body when this one returns, woken by the release at once; a leader that
/// crashes is followed when its lease (`ttl`) runs out. Only an error that
/// waiting will not change ends the wait, or Redis staying unreachable for
/// longer than the client's default wait: `Unavailable`. Drop the future to
/// stop campaigning.
///
/// The leader's **term** is the lease's fencing token, always taken: larger
/// than every earlier leader's of the key. Read it with
/// `lock_core::current_lock().unwrap().fencing_token()` and hand it to what
/// the leader writes, so that a leader that paused past its lease and kept
/// going is refused once a newer one has written.
///
/// The lease is renewed while the body runs, and the body ends the term:
/// when it returns (or panics, or the future is dropped) the leader
/// resigns. A lost lease (cut off from Redis past the ttl, broken by an
/// operator) follows `on_lost`: by default the body is dropped at its next
/// await and the function returns the `Lost` error, and a service loop
/// calls the function again to campaign again.
///
/// ```
/// use lock_core::{LockClient, LockError, MemoryStore, distributed_lock};
/// use std::time::Duration;
///
/// /// Runs on one replica at a time; returns its term.
/// #[distributed_lock(key = "scheduler:{region}", ttl = "10s", wait = "forever")]
/// async fn schedule(region: &str) -> Result<u64, LockError> {
///     let term = lock_core::current_lock().unwrap().fencing_token().unwrap();
///     // Schedule the region's jobs, each write carrying `term`.
///     Ok(term)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// let store = MemoryStore::new();
/// let other_replica = LockClient::in_memory_on(&store);
/// let leading = other_replica.campaign("scheduler:eu", Duration::from_secs(10)).await?;
/// let this_replica = LockClient::in_memory_on(&store);
/// let waiting = tokio::spawn(lock_core::with_default_client(this_replica, schedule("eu")));
///
/// // The other replica leads; this one waits, however long that takes.
/// let earlier_term = leading.term();
/// leading.resign().await?;
/// let term = waiting.await.expect("no panic")?;
/// assert!(term > earlier_term, "every new leader has a larger term");
/// # Ok(()) }
/// ```
///
/// A service that must run on one replica at a time loops over it:
///
/// ```no_run
/// use lock_core::{LockError, distributed_lock};
/// use std::time::Duration;
///
/// #[distributed_lock(key = "outbox-relay", ttl = "15s", wait = "forever")]
/// async fn relay_outbox() -> Result<(), LockError> {
///     loop {
///         // Relay a batch, each write fenced with current_lock()'s token;
///         // return to step down.
///         tokio::time::sleep(Duration::from_secs(1)).await;
///     }
/// }
///
/// /// Leads whenever it can, for as long as the service runs.
/// async fn serve() -> Result<(), LockError> {
///     loop {
///         match relay_outbox().await {
///             // The lease was lost: campaign again.
///             Err(e) if e.is_lost() => continue,
///             other => return other,
///         }
///     }
/// }
/// # fn main() { let _ = serve; }
/// ```
///
/// `wait = "forever"` takes one `key`, exclusive and fenced: it goes with
/// none of `keys`, `mode = "shared"`, `permits`, `fencing = false`,
/// `renew = false`, `min_hold` and `max_hold`. `ttl`, `on_lost`, `client`
/// and `crate` apply as elsewhere.
///
/// # `renew`
///
/// Whether a heartbeat renews the lease while the body runs (default
/// `true`). With `renew = false` the lock expires after `ttl` whatever the
/// body does, and counts as lost from then on (see `on_lost`).
///
/// ```
/// # use lock_core::{LockClient, LockError, distributed_lock};
/// #[distributed_lock(key = "rate:{user_id}", ttl = "1s", renew = false)]
/// async fn throttled(user_id: u64) -> Result<u64, LockError> {
///     Ok(user_id)
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// # lock_core::with_default_client(LockClient::in_memory(), async {
/// # assert_eq!(throttled(5).await?, 5);
/// # Ok(()) }).await }
/// ```
///
/// # `on_lost`
///
/// What happens when the lock is lost while the body runs (renewal found
/// another owner, or could not reach Redis before the lease ran out):
///
/// - `"abort"` (default): the body is dropped at its next await and the
///   function returns the `Lost` error.
/// - `"continue"`: the body finishes and its result is returned; check
///   fencing tokens or make the work idempotent.
///
/// ```
/// # use lock_core::{LockClient, LockError, distributed_lock};
/// #[distributed_lock(key = "migrate:{table}", on_lost = "continue")]
/// async fn migrate(table: &str) -> Result<usize, LockError> {
///     // Finishes even when the lock is lost meanwhile: make it idempotent.
///     Ok(table.len())
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// # lock_core::with_default_client(LockClient::in_memory(), async {
/// # assert_eq!(migrate("orders").await?, 6);
/// # Ok(()) }).await }
/// ```
///
/// # `fencing`
///
/// Whether to take a fencing token (default `false`): a number that grows
/// with every holder of the key, for the protected resource to refuse
/// writes from a holder that lost the lock without noticing. Read it with
/// `lock_core::current_lock()`.
///
/// ```
/// # use lock_core::{LockClient, LockError, distributed_lock};
/// #[distributed_lock(key = "ledger:{account}", fencing = true)]
/// async fn post(account: u64) -> Result<u64, LockError> {
///     let token = lock_core::current_lock().and_then(|lock| lock.fencing_token());
///     // Hand the token to the storage, which refuses one lower than it has seen.
///     Ok(token.expect("taken with fencing = true"))
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// # lock_core::with_default_client(LockClient::in_memory(), async {
///
/// let first = post(7).await?;
/// let second = post(7).await?;
/// assert!(second > first, "every later holder has a larger token");
/// # Ok(()) }).await }
/// ```
///
/// # `min_hold`
///
/// Keep the lock at least this long after it was taken, even when the body
/// finishes sooner: the release then shortens the lease to what is left
/// instead of deleting it. For scheduled work that every replica starts on
/// the same tick: a fast run must not let another replica run the tick
/// again. At most `max_hold`.
///
/// ```
/// # use lock_core::{LockClient, LockError, distributed_lock};
/// #[distributed_lock(key = "nightly-report:{day}", wait = "0s", min_hold = "5m")]
/// async fn nightly_report(day: u32) -> Result<(), LockError> {
///     Ok(())
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// # lock_core::with_default_client(LockClient::in_memory(), async {
///
/// nightly_report(14).await?;
/// // Finished in no time, but the lock stays taken for the 5 minutes:
/// // the other replicas skip this tick.
/// assert!(nightly_report(14).await.unwrap_err().is_contended());
/// # Ok(()) }).await }
/// ```
///
/// # `max_hold`
///
/// Hold the lock at most this long: renewal stops then and the lock is
/// treated as lost (with `on_lost = "abort"`, the body is dropped and the
/// call returns a `Lost` error), so a runaway body cannot hold a lock
/// forever. At least the ttl.
///
/// ```
/// # use lock_core::{LockClient, LockError, distributed_lock};
/// #[distributed_lock(key = "import:{batch}", ttl = "30s", max_hold = "10m")]
/// async fn import(batch: u64) -> Result<u64, LockError> {
///     Ok(batch)
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// # lock_core::with_default_client(LockClient::in_memory(), async {
/// # assert_eq!(import(3).await?, 3);
/// # Ok(()) }).await }
/// ```
///
/// # `mode`
///
/// `"exclusive"` (default): one holder at a time. `"shared"`: any number of
/// shared holders at once, and none while an exclusive holder (a function
/// on the same key without `mode`, or the guard API) holds it; once an
/// exclusive caller waits for the key, new shared callers wait behind it,
/// so a stream of readers cannot starve a writer. Each shared holder has
/// its own lease: a crashed one's hold runs out by itself. Not on a Redlock
/// client.
///
/// ```
/// # use lock_core::{LockClient, LockError, distributed_lock};
/// #[distributed_lock(key = "catalog:{region}", mode = "shared")]
/// async fn read_catalog(region: &str) -> Result<usize, LockError> {
///     Ok(region.len())
/// }
///
/// #[distributed_lock(key = "catalog:{region}")]
/// async fn rebuild_catalog(region: &str) -> Result<(), LockError> {
///     Ok(())
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// # lock_core::with_default_client(LockClient::in_memory(), async {
///
/// // Readers run side by side; the rebuild runs alone.
/// let (a, b) = tokio::join!(read_catalog("eu"), read_catalog("eu"));
/// assert_eq!(a? + b?, 4);
/// rebuild_catalog("eu").await?;
/// # Ok(()) }).await }
/// ```
///
/// # `permits`
///
/// At most this many holders of the key at once, across every process (a
/// semaphore whose permits expire with their holders' leases): an integer
/// literal from 1 to `u32::MAX`. Every holder of a key must ask for the
/// same number; one asking with another gets a `Config` error. It is a kind
/// of lock of its own, so it goes with neither `mode` nor `keys`. Not on a
/// Redlock client.
///
/// ```
/// # use lock_core::{LockClient, LockError, distributed_lock};
/// // At most three exports run at once, fleet-wide.
/// #[distributed_lock(key = "exports", permits = 3)]
/// async fn export(batch: u64) -> Result<u64, LockError> {
///     Ok(batch)
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// # lock_core::with_default_client(LockClient::in_memory(), async {
/// # assert_eq!(export(8).await?, 8);
/// # Ok(()) }).await }
/// ```
///
/// # `client`
///
/// The client to lock with: an expression giving a `LockClient`, a
/// reference to one, or an `Arc`/`Box` of one. It is evaluated before the
/// body starts and may use the parameters. Without it the function uses the
/// process-wide client installed with `lock_core::set_global_client`, and
/// returns a `NotInitialized` error if there is none.
///
/// ```
/// use lock_core::{LockClient, LockError, distributed_lock};
/// use std::sync::Arc;
///
/// struct Worker {
///     locks: LockClient,
/// }
///
/// impl Worker {
///     #[distributed_lock(key = "shard:{shard}", client = self.locks)]
///     async fn run(self: Arc<Self>, shard: u32) -> Result<u32, LockError> {
///         Ok(shard)
///     }
/// }
///
/// #[distributed_lock(key = "tenant:{tenant}", client = locks)]
/// async fn reindex(locks: &LockClient, tenant: u64) -> Result<u64, LockError> {
///     Ok(tenant)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// let worker = Arc::new(Worker { locks: LockClient::in_memory() });
/// assert_eq!(worker.clone().run(3).await?, 3);
/// assert_eq!(reindex(&worker.locks, 9).await?, 9);
/// # Ok(()) }
/// ```
///
/// # `crate`
///
/// The path to lock-core, for a dependency renamed in `Cargo.toml`
/// (`locks = { package = "lock-core", .. }`). Generated code reaches
/// lock-core only through this path.
///
/// ```
/// # extern crate lock_core as locks;
/// // Cargo.toml: locks = { package = "lock-core", version = "0.1" }
/// #[locks::distributed_lock(key = "job", crate = "::locks")]
/// async fn job() -> Result<(), locks::LockError> {
///     Ok(())
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), locks::LockError> {
/// # locks::with_default_client(locks::LockClient::in_memory(), job()).await }
/// ```
///
/// # Exit paths
///
/// - `Ok`, `Err`, `?` and `return`: the lock is released before the
///   function returns.
/// - A panic in the body: the lock is released, then the panic continues.
/// - The caller drops the future (a timeout, `select!`, an aborted task):
///   the lock is released in the background at once, not after the ttl.
/// - The lock is lost while the body runs: see `on_lost`.
///
/// # Re-entry
///
/// A body that calls another annotated function (or itself) with the same
/// rendered key, through the same client or a clone of it, does not wait
/// behind its own lock: the nested call **re-enters** at once, with no
/// Redis command. Its body runs under the outer lease, and
/// [`lock_core::current_lock()`] there gives the same key and fencing
/// token. The nested return does not release; the outermost one does. With
/// `on_lost = "abort"` the nested body is still aborted when the shared
/// lease is lost. The guard API (`lock`, `lock_with`, `try_lock`) called in
/// the body re-enters the same way.
///
/// A re-entry keeps the outer lease as it is: the nested call's `ttl`,
/// `wait`, `renew`, `min_hold` and `max_hold` are not applied, and
/// `fencing = true` under an outer lock taken without fencing returns a
/// `Config` error (there is no token to give). A lease already lost gives a
/// `Lost` error at once.
///
/// Not a re-entry, and so waits like any other owner: a task spawned inside
/// the body (another task), another client, and a lock taken with the
/// guard API in a plain task (there is no body to remember it: asking
/// again for the same key in that task waits for that guard).
///
/// ```
/// # use lock_core::{LockClient, LockError, distributed_lock};
/// #[distributed_lock(key = "account:{id}")]
/// async fn transfer(id: u64, cents: i64) -> Result<i64, LockError> {
///     debit(id, cents).await // re-enters `account:{id}`: no second round trip
/// }
///
/// #[distributed_lock(key = "account:{id}")]
/// async fn debit(id: u64, cents: i64) -> Result<i64, LockError> {
///     Ok(-cents)
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// # lock_core::with_default_client(LockClient::in_memory(), async {
/// # assert_eq!(transfer(1, 250).await?, -250);
/// # Ok(()) }).await }
/// ```
///
/// # Compile errors
///
/// Each is reported on the token to fix, several at once, and the function
/// is still emitted so the rest of the crate keeps type-checking:
///
/// - **`key`**: missing (and no `keys`); empty; not a string literal; an
///   unknown placeholder (the message names the parameters that exist and suggests
///   the closest one); `{self...}` without a receiver; a placeholder bound
///   inside a destructuring pattern; an unbalanced `{` or `}`; an empty
///   `{}`, a positional `{0}` or a format spec `{x:?}`; a value whose type
///   is not `Display` (on the key literal); a field the value does not
///   have (`{self.m}`: rustc's "no field `m` on type `&Svc`", on the key
///   literal, with no fix-it that would rewrite the attribute).
/// - **`keys`**: together with `key`; not a list; an element that is not a
///   string literal; an empty list; a template listed twice; each template
///   checked as `key` is, with the error on that template; with
///   `mode = "shared"` or `permits`.
/// - **`mode` and `permits`**: a `mode` other than `"exclusive"` or
///   `"shared"`; `permits` that is not an integer literal, is 0, negative,
///   or over `u32::MAX`; `permits` with `mode`.
/// - **Arguments**: unknown (the valid ones are listed, with a "did you
///   mean"); set twice; without a value; a value of the wrong kind
///   (`renew = "true"`, `ttl = 30`, `on_lost = continue`,
///   `client = "self.locks"`).
/// - **`wait = "forever"`**: with `keys`, `mode = "shared"`, `permits`,
///   `fencing = false`, `renew = false`, `min_hold` or `max_hold` (on that
///   argument); a `wait` that is a word other than `"forever"`
///   (`"infinite"`); `wait = forever` without quotes. An unknown argument
///   like `leader` or `election` is told to write `wait = "forever"`.
/// - **Durations**: malformed (no unit, unknown unit, fraction, units out
///   of order); a ttl of zero, under 10ms or over 24h; a wait, `min_hold`
///   or `max_hold` over 24h; a `max_hold` shorter than the ttl or than
///   `min_hold`; an `on_lost` other than `"abort"` or `"continue"`.
/// - **The function**: not `async`; `const`; no return type; a return type
///   that is not `Result<T, E>` with `E: From<lock_core::LockError>`; an
///   error type without `From<LockError>` (one error, on the error type,
///   saying to add `impl From<lock_core::LockError> for MyError`); a trait
///   method without a body.
///
/// [`lock_core::current_lock()`]: https://docs.rs/lock-core/latest/lock_core/fn.current_lock.html
/// [`LockClient::campaign`]: https://docs.rs/lock-core/latest/lock_core/struct.LockClient.html#method.campaign
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let original = proc_macro2::TokenStream::from(item.clone());
    let func = match syn::parse::<attr::LockedFn>(item) {
        Ok(func) => func,
        Err(e) => return with_item(e, original),
    };
    let args = syn::parse::<attr::Args>(args);
    match valid::check(&args, &func) {
        Ok(lock) => expand::expand(&func, &lock).into(),
        Err(e) => with_item(e, original),
    }
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The errors, then the function unchanged, so the rest of the crate still
/// sees it and type-checks.
fn with_item(errors: syn::Error, item: proc_macro2::TokenStream) -> TokenStream {
    let mut out = errors.into_compile_error();
    out.extend(item);
    out.into()
}
