//! Redis ACLs: a user holding exactly the documented permissions runs every
//! behavioural case without a single denial, and a user missing one gets a
//! clear `Server` error at the operation that needs it (or, for
//! `SUBSCRIBE`, waits by polling instead).

use crate::support::{eventually, subscribers};
use lock_core::{ErrorKind, LockClient, LockError, LockOptions};
use lock_testkit::RedisServer;
use std::collections::HashMap;
use std::time::Duration;
use tokio::time::{Instant, timeout};

/// The page the users come from.
pub(crate) const DEPLOYMENT_DOC: &str = include_str!("../../docs/deployment.md");

/// The prefix the documented users are written for.
const DOC_PREFIX: &str = "lock:";

/// The rules of the documented user `user`: the tokens after the password
/// of the page's `ACL SETUSER <user> reset on >password ...` line, with the
/// key and channel patterns of the prefix `lock:` turned into those of
/// `prefix`.
pub(crate) fn documented_rules(user: &str, prefix: &str) -> Vec<String> {
    let head = format!("ACL SETUSER {user} reset on >");
    let line = DEPLOYMENT_DOC
        .lines()
        .find(|line| line.starts_with(&head))
        .unwrap_or_else(|| panic!("docs/deployment.md has no line {head:?}..."));
    let rules: Vec<String> = line
        .split_whitespace()
        .skip(6)
        .map(|rule| match rule.strip_prefix(['~', '&']) {
            Some(pattern) => {
                let rest = pattern
                    .strip_prefix(DOC_PREFIX)
                    .unwrap_or_else(|| panic!("{rule} is not under {DOC_PREFIX}"));
                format!("{}{prefix}{rest}", &rule[..1])
            }
            None => rule.to_owned(),
        })
        .collect();
    assert!(
        rules.iter().all(|rule| rule.starts_with(['+', '~', '&'])),
        "{rules:?}"
    );
    rules
}

const PREFIX: &str = "acl:lock:";
const ADMIN_PASSWORD: &str = "admin-secret";
/// Bound on anything expected to finish.
const BOUND: Duration = Duration::from_secs(10);

/// The documented user for a client with key prefix `acl:lock:`
/// (docs/deployment.md, "Redis ACL"), read from that page.
fn lock_client_rules() -> Vec<String> {
    documented_rules("locker", PREFIX)
}

/// The documented operator's user (`inspect`, `list`, `force_release`,
/// `lockctl`), read from the same page.
fn operator_rules() -> Vec<String> {
    documented_rules("lock-operator", PREFIX)
}

/// A server whose default user needs a password, as in production; the
/// kit's own commands use it.
pub(crate) fn server() -> RedisServer {
    RedisServer::builder().password(ADMIN_PASSWORD).start()
}

/// Creates (or replaces) user `name` with password `name-pw` and exactly
/// `rules`.
pub(crate) fn create_user(server: &RedisServer, name: &str, rules: &[String]) {
    let password = format!(">{name}-pw");
    let mut args = vec!["ACL", "SETUSER", name, "reset", "on", &password];
    args.extend(rules.iter().map(String::as_str));
    let _: () = server.cmd(&args);
}

/// The documented rules, minus `missing`, plus `extra`.
fn rules_without(missing: &str, extra: &[&str]) -> Vec<String> {
    let rules = lock_client_rules();
    assert!(rules.iter().any(|rule| rule == missing), "{missing}");
    rules
        .into_iter()
        .filter(|rule| rule != missing)
        .chain(extra.iter().map(|rule| (*rule).to_owned()))
        .collect()
}

pub(crate) fn user_url(server: &RedisServer, name: &str) -> String {
    format!("redis://{name}:{name}-pw@127.0.0.1:{}", server.port())
}

async fn try_client(server: &RedisServer, user: &str) -> Result<LockClient, LockError> {
    timeout(
        BOUND,
        LockClient::builder()
            .url(user_url(server, user))
            .key_prefix(PREFIX)
            .operation_timeout(Duration::from_secs(1))
            .connect_timeout(Duration::from_secs(2))
            .build(),
    )
    .await
    .expect("build is bounded")
}

async fn client_as(server: &RedisServer, user: &str) -> LockClient {
    try_client(server, user)
        .await
        .unwrap_or_else(|e| panic!("client for user {user}: {e}\n{}", server.log()))
}

/// One `ACL LOG` entry: why (`command`, `key`, `channel`), where
/// (`toplevel`, `lua`, `multi`), what (the command, key or channel).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Denial {
    reason: String,
    context: String,
    object: String,
    username: String,
}

pub(crate) fn denials(server: &RedisServer) -> Vec<Denial> {
    let entries: Vec<HashMap<String, redis::Value>> = server.cmd(&["ACL", "LOG"]);
    let text = |entry: &HashMap<String, redis::Value>, field: &str| {
        entry
            .get(field)
            .and_then(|value| redis::from_redis_value_ref::<String>(value).ok())
            .unwrap_or_default()
    };
    entries
        .iter()
        .map(|entry| Denial {
            reason: text(entry, "reason"),
            context: text(entry, "context"),
            object: text(entry, "object"),
            username: text(entry, "username"),
        })
        .collect()
}

/// [`denials`] but for the connection metadata the redis crate sends and
/// ignores a refusal of (`CLIENT SETINFO`, Redis 7.2 and later: the
/// optional `+client|setinfo`).
pub(crate) fn refusals(server: &RedisServer) -> Vec<Denial> {
    denials(server)
        .into_iter()
        .filter(|d| d.object != "client|setinfo")
        .collect()
}

/// Asserts `err` is a `Server` error explaining a denied permission, and
/// that its text contains `needle`. Returns the text.
fn assert_denied(err: &LockError, needle: &str) -> String {
    let text = err.to_string();
    eprintln!("{text}");
    assert_eq!(err.kind(), ErrorKind::Server, "{text}");
    assert!(
        text.contains("permission denied by the server's ACL"),
        "{text}"
    );
    assert!(text.contains(needle), "{needle:?} not in: {text}");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_runs_every_case_without_a_denial() {
    let server = server();
    create_user(&server, "locker", &lock_client_rules());
    let a = client_as(&server, "locker").await;
    let b = client_as(&server, "locker").await;

    // lock, contention (try_lock and a wait that runs out), release.
    let guard = a.lock("job", Duration::from_secs(10)).await.unwrap();
    assert!(
        b.try_lock("job", Duration::from_secs(5))
            .await
            .unwrap()
            .is_none()
    );
    let opts = LockOptions::new(Duration::from_secs(5)).wait(Duration::from_millis(100));
    let err = b.lock_with("job", opts).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Contended, "{err}");

    // a waiter subscribed to the release channel is woken by the release.
    let storage_key = a.storage_key("job").unwrap();
    let waiter = tokio::spawn(async move {
        let opts = LockOptions::new(Duration::from_secs(5)).wait(BOUND);
        let guard = b.lock_with("job", opts).await.unwrap();
        assert!(guard.release().await.unwrap());
        b
    });
    eventually(
        BOUND,
        "the waiter subscribes to the release channel",
        || subscribers(&server, &storage_key) >= 1,
    )
    .await;
    assert!(guard.release().await.unwrap());
    let b = timeout(BOUND, waiter).await.unwrap().unwrap();

    // extend, and renewal seen from the server.
    let ttl = Duration::from_millis(300);
    let guard = a.lock("renewed", ttl).await.unwrap();
    guard.extend(Duration::from_millis(400)).await.unwrap();
    let key = a.storage_key("renewed").unwrap();
    let mut renewals = 0;
    let mut last: i64 = server.cmd(&["PTTL", &key]);
    let started = Instant::now();
    while renewals < 3 {
        assert!(started.elapsed() < BOUND, "{renewals} renewals");
        let now: i64 = server.cmd(&["PTTL", &key]);
        assert!(now > 0 && !guard.is_lost(), "lost the renewed lock");
        if now > last {
            renewals += 1;
        }
        last = now;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(guard.release().await.unwrap());

    // fencing.
    let fenced = LockOptions::new(Duration::from_secs(5)).fencing(true);
    let first = a.lock_with("fenced", fenced.clone()).await.unwrap();
    let token = first.fencing_token().unwrap();
    assert!(first.release().await.unwrap());
    let second = b.lock_with("fenced", fenced).await.unwrap();
    assert!(second.fencing_token().unwrap() > token);
    assert!(second.release().await.unwrap());

    // Scripts flushed (a restart, a failover): reloaded with SCRIPT LOAD.
    let _: () = server.cmd(&["SCRIPT", "FLUSH"]);
    let guard = a.lock("after-flush", Duration::from_secs(5)).await.unwrap();
    assert!(guard.release().await.unwrap());

    // Nothing was refused, but for the connection metadata the redis crate
    // sends and ignores a refusal of (`CLIENT SETINFO`, Redis 7.2 and later:
    // the optional `+client|setinfo`).
    let refused: Vec<Denial> = denials(&server)
        .into_iter()
        .filter(|d| d.object != "client|setinfo")
        .collect();
    assert_eq!(refused, Vec::new(), "the ACL refused something");
}

#[tokio::test]
async fn a_missing_command_is_a_clear_error_where_it_is_needed() {
    let server = server();

    // No EVALSHA: every renewal and release runs a script, so the client
    // is refused at startup, saying what to add.
    create_user(&server, "no-evalsha", &rules_without("+evalsha", &[]));
    let err = try_client(&server, "no-evalsha").await.unwrap_err();
    assert_denied(&err, "may not run `evalsha`");
    assert!(err.to_string().contains("ACL SETUSER <user> +evalsha"));

    // No TIME: plain locks work, a fencing token is refused at acquisition.
    create_user(&server, "no-time", &rules_without("+time", &[]));
    let client = client_as(&server, "no-time").await;
    let guard = client.lock("b", Duration::from_secs(5)).await.unwrap();
    assert!(guard.release().await.unwrap());
    let _: () = server.cmd(&["ACL", "LOG", "RESET"]);
    let opts = LockOptions::new(Duration::from_secs(5))
        .fencing(true)
        .wait(Duration::ZERO);
    let err = client.lock_with("c", opts).await.unwrap_err();
    let text = assert_denied(&err, "+time");
    assert!(text.contains("script"), "{text}");
    assert_eq!(err.key(), Some("c"));
    // The server's ACL LOG names the command the script was refused.
    let log = denials(&server);
    assert!(
        log.iter()
            .any(|d| d.object == "time" && d.context == "lua" && d.username == "no-time"),
        "{log:?}"
    );

    // No PEXPIRE: a renewal (here `extend` to a longer ttl) is refused
    // inside its script.
    create_user(&server, "no-pexpire", &rules_without("+pexpire", &[]));
    let client = client_as(&server, "no-pexpire").await;
    let opts = LockOptions::new(Duration::from_secs(5)).renew(false);
    let guard = client.lock_with("d", opts).await.unwrap();
    let err = guard.extend(Duration::from_secs(10)).await.unwrap_err();
    let text = assert_denied(&err, "+pexpire");
    assert!(text.contains("script"), "{text}");
    assert!(!guard.is_lost(), "a refusal is not a loss");
    assert!(guard.release().await.unwrap());

    // No GET: a script's read of the lock key is refused; the client is
    // refused at startup, naming what scripts need.
    create_user(&server, "no-get", &rules_without("+get", &[]));
    let err = try_client(&server, "no-get").await.unwrap_err();
    let text = assert_denied(&err, "+get");
    assert!(text.contains("script"), "{text}");
    let log = denials(&server);
    assert!(
        log.iter()
            .any(|d| d.object == "get" && d.context == "lua" && d.username == "no-get"),
        "{log:?}"
    );

    // No PING: the client cannot even be built, and says why.
    create_user(&server, "no-ping", &rules_without("+ping", &[]));
    let err = try_client(&server, "no-ping").await.unwrap_err();
    assert_denied(&err, "may not run `ping`");
}

#[tokio::test]
async fn keys_outside_the_pattern_are_refused_clearly() {
    let server = server();
    let mut rules = rules_without("~acl:lock:*", &["~other:*"]);
    rules.retain(|rule| rule != "&acl:lock:*");
    rules.push("&other:*".to_owned());
    create_user(&server, "other-prefix", &rules);
    // Refused at startup: the client's own prefix is out of reach.
    let err = try_client(&server, "other-prefix").await.unwrap_err();
    assert_denied(&err, "ACL SETUSER <user> ~<prefix>*");
}

#[tokio::test]
async fn release_without_publish_is_refused_after_deleting() {
    let server = server();
    create_user(&server, "no-publish", &rules_without("+publish", &[]));
    let client = client_as(&server, "no-publish").await;
    let guard = client.lock("p", Duration::from_secs(30)).await.unwrap();
    let key = client.storage_key("p").unwrap();
    let err = guard.release().await.unwrap_err();
    assert_denied(&err, "+publish");
    // A script is not rolled back: the DEL before the refused PUBLISH
    // stands, so the lock is free even though release reported an error.
    assert_eq!(server.cmd::<i64>(&["EXISTS", &key]), 0);
}

#[tokio::test]
async fn a_wrong_password_is_a_clear_error() {
    let server = server();
    create_user(&server, "locker", &lock_client_rules());
    let url = format!("redis://locker:wrong@127.0.0.1:{}", server.port());
    let err = timeout(BOUND, LockClient::builder().url(url).build())
        .await
        .unwrap()
        .unwrap_err();
    eprintln!("{err}");
    assert_eq!(err.kind(), ErrorKind::Server, "{err}");
    assert!(err.to_string().contains("user name and password"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_subscribe_waiting_falls_back_to_polling() {
    let server = server();
    create_user(&server, "no-subscribe", &rules_without("+subscribe", &[]));
    let holder = client_as(&server, "no-subscribe").await;
    let waiter = client_as(&server, "no-subscribe").await;

    let guard = holder.lock("w", Duration::from_secs(30)).await.unwrap();
    let _: () = server.cmd(&["ACL", "LOG", "RESET"]);
    let waiting = tokio::spawn(async move {
        let opts = LockOptions::new(Duration::from_secs(5)).wait(BOUND);
        let guard = waiter.lock_with("w", opts).await.unwrap();
        guard.release().await.unwrap()
    });
    // The waiter asked for wake-ups and was refused...
    eventually(BOUND, "the waiter's SUBSCRIBE is refused", || {
        denials(&server)
            .iter()
            .any(|d| d.object == "subscribe" && d.username == "no-subscribe")
    })
    .await;
    // ...and still gets the lock once it is released, by polling.
    assert!(guard.release().await.unwrap());
    let released = timeout(BOUND, waiting)
        .await
        .expect("the waiter is bounded");
    assert!(released.unwrap());
}

/// The operator's documented rules run inspect, list and force_release
/// without a denial; the evicted holder's renewal reads the tombstone
/// under the same key pattern. A lock client's user without `+scan` gets a
/// clear error when listing. (Shared locks and permits under these users:
/// deployment/acl.rs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_acl_runs_inspect_list_and_force_release() {
    let server = server();
    create_user(&server, "locker", &lock_client_rules());
    create_user(&server, "operator", &operator_rules());
    let locker = client_as(&server, "locker").await;
    let operator = client_as(&server, "operator").await;

    let held = locker.lock("stuck", Duration::from_secs(1)).await.unwrap();
    let fenced = LockOptions::new(Duration::from_secs(5)).fencing(true);
    let other = locker.lock_with("other", fenced).await.unwrap();
    let state = operator.inspect("stuck").await.unwrap().unwrap();
    assert!(state.holder().is_some());
    assert_eq!(operator.list_all(None).await.unwrap().len(), 2);
    assert!(operator.force_release("stuck").await.unwrap());
    timeout(BOUND, held.lost()).await.unwrap();
    assert_eq!(
        held.loss_reason(),
        Some(lock_core::LossReason::ForceReleased)
    );
    assert!(other.release().await.unwrap());

    let refused: Vec<Denial> = denials(&server)
        .into_iter()
        .filter(|d| d.object != "client|setinfo")
        .collect();
    assert_eq!(refused, Vec::new(), "the ACL refused something");

    let err = locker.list_all(None).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Server, "{err}");
    assert!(err.to_string().contains("scan"), "{err}");
}

/// A user whose `EVALSHA` is taken away while it holds a lock: the first
/// renewal is refused, and the lock is reported lost at once, saying Redis
/// refused it (not at its deadline as an unanswered renewal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_renewal_is_a_loss_that_says_so() {
    let server = server();
    create_user(&server, "revoked", &lock_client_rules());
    let client = client_as(&server, "revoked").await;
    let ttl = Duration::from_secs(3);
    let guard = client.lock("renewed", ttl).await.unwrap();
    let _: () = server.cmd(&["ACL", "SETUSER", "revoked", "-evalsha", "-eval"]);
    tokio::time::timeout(ttl, guard.lost())
        .await
        .expect("the refused renewal was reported within the ttl");
    assert_eq!(guard.loss_reason(), Some(lock_core::LossReason::Refused));
}
