//! `lockctl` as an operator runs it: the built binary against a
//! `redis-server` of the test's own (never the one on port 6379).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lock_core::{LockClient, LockOptions, LossReason};
use lock_testkit::RedisServer;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

const TTL: Duration = Duration::from_secs(5);

fn lockctl(server: &RedisServer, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .arg("--url")
        .arg(server.url())
        .arg("--prefix")
        .arg("app:")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("lockctl runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn client(server: &RedisServer, holder: &str) -> LockClient {
    LockClient::builder()
        .url(server.url())
        .key_prefix("app:")
        .holder_name(holder)
        .build()
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", server.log()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_show_name_the_holders() {
    let server = RedisServer::start();
    let a = client(&server, "billing-7").await;
    let _one = a.lock("order:1", TTL).await.unwrap();
    let fenced = a
        .lock_with("order:2", LockOptions::new(TTL).fencing(true))
        .await
        .unwrap();
    let fence = fenced.fencing_token().unwrap().to_string();

    let out = lockctl(&server, &["list"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(table.starts_with("KEY"), "{table}");
    assert!(
        table.contains("order:1") && table.contains("order:2"),
        "{table}"
    );
    assert!(
        table.contains("billing-7") && table.contains(&fence),
        "{table}"
    );

    let out = lockctl(&server, &["--json", "list", "order:2"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 1, "{rows}");
    assert_eq!(rows[0]["holder"], "billing-7");
    assert_eq!(rows[0]["fencing_token"].to_string(), fence);

    let out = lockctl(&server, &["show", "order:1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("billing-7"));

    let out = lockctl(&server, &["show", "order:3"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stdout).trim(), "order:3 is free");
    let out = lockctl(&server, &["--json", "show", "order:3"]);
    assert_eq!(out.status.code(), Some(1));
    let free: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(free["held"], false);
}

/// Waiters are shown: `show` names each one and how long it has waited,
/// `list` counts them, `--json` gives both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_and_list_name_the_waiters() {
    let server = RedisServer::start();
    let holder = client(&server, "billing-7").await;
    let _held = holder
        .lock("order:9", Duration::from_secs(30))
        .await
        .unwrap();
    let waiter = client(&server, "refunds-2").await;
    let waiting = tokio::spawn(async move {
        let options = LockOptions::new(TTL).wait(Duration::from_secs(20));
        waiter.lock_with("order:9", options).await.map(drop)
    });
    let started = std::time::Instant::now();
    while holder.inspect("order:9").await.unwrap().unwrap().waiting() == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never recorded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let out = lockctl(&server, &["show", "order:9"]);
    let shown = text(&out.stdout);
    assert!(shown.contains("waiting:       1 task"), "{shown}");
    assert!(shown.contains("  refunds-2 for "), "{shown}");
    let out = lockctl(&server, &["list"]);
    let table = text(&out.stdout);
    let header = table.lines().next().unwrap();
    assert!(header.ends_with("WAITING"), "{table}");
    let row = table.lines().find(|l| l.starts_with("order:9")).unwrap();
    assert!(row.ends_with(" 1"), "{table}");
    let out = lockctl(&server, &["--json", "show", "order:9"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["waiting"], 1, "{json}");
    assert_eq!(json["waiters"][0]["holder"], "refunds-2", "{json}");
    assert!(
        json["waiters"][0]["waited_ms"].as_u64().unwrap() >= 50,
        "{json}"
    );
    waiting.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_refuses_without_a_terminal_and_breaks_with_force() {
    let server = RedisServer::start();
    let a = client(&server, "stuck-worker").await;
    let held = a.lock("job", TTL).await.unwrap();

    let out = lockctl(&server, &["release", "job"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("--force") && err.contains("not a terminal"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!held.is_lost());

    let out = lockctl(&server, &["release", "job", "--force"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(said.contains("evicted stuck-worker"), "{said}");
    assert!(said.contains("s left"), "what the lease had left: {said}");
    tokio::time::timeout(TTL, held.lost()).await.unwrap();
    assert_eq!(held.loss_reason(), Some(LossReason::ForceReleased));

    let out = lockctl(&server, &["--json", "release", "job", "--force"]);
    assert!(out.status.success());
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["released"], false);

    // JSON shows what the evicted lease had left, not 0.
    let _other = a.lock("other", TTL).await.unwrap();
    let out = lockctl(&server, &["--json", "release", "other", "--force"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["released"], true);
    let left = answer["evicted"]["remaining_ms"].as_u64().unwrap();
    let ttl = u64::try_from(TTL.as_millis()).unwrap();
    assert!(left > ttl / 2 && left <= ttl, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_under_a_wrong_prefix_names_the_prefix_it_searched() {
    let server = RedisServer::start();
    let a = client(&server, "billing-7").await;
    let _held = a.lock("order:1", TTL).await.unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args(["--url", &server.url(), "--prefix", "billing:", "list"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout).trim(),
        "no locks held under the prefix \"billing:\" \
         (--prefix is the services' key prefix, default \"lock:\")"
    );
    let out = lockctl(&server, &["list", "invoice:*"]);
    assert_eq!(
        text(&out.stdout).trim(),
        "no locks held under the prefix \"app:\" matching \"invoice:*\" \
         (--prefix is the services' key prefix, default \"lock:\")"
    );
}

/// `lockctl ARGS` started in the background, and a function that returns
/// its next line of output, failing the test when none comes within 10 s.
fn watching(server: &RedisServer, args: &[&str]) -> (Child, impl Fn() -> String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args(["--url", &server.url(), "--prefix", "app:"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Lines come through a thread of their own, so that a missing one
    // fails the test after a bound instead of hanging it.
    let stdout = child.stdout.take().unwrap();
    let (lines, next) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if lines.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let next_line = move || {
        next.recv_timeout(Duration::from_secs(10))
            .expect("lockctl watch printed no line within 10 s")
    };
    (child, next_line)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_each_change_of_holder() {
    let server = RedisServer::start();
    let a = client(&server, "first").await;
    let b = client(&server, "second").await;
    let first = a.lock("w", TTL).await.unwrap();
    let (mut child, next_line) = watching(
        &server,
        &["watch", "w", "--interval-ms", "50", "--changes", "3"],
    );
    let line = next_line();
    assert!(line.contains("held by first"), "{line}");
    first.release().await.unwrap();
    // The free key is printed before anyone takes it again.
    assert_eq!(next_line(), "w: free");
    let second = b.lock("w", TTL).await.unwrap();
    let line = next_line();
    assert!(line.contains("held by second"), "{line}");
    let status = child.wait().unwrap();
    assert!(status.success());
    second.release().await.unwrap();
}

/// Whether `since` reads as a UTC time, like `2026-12-03T16:19:34.123Z`.
fn is_utc(since: &str) -> bool {
    let shape = since.chars().enumerate().all(|(i, c)| match i {
        4 | 7 => c == '-',
        10 => c == 'T',
        13 | 16 => c == ':',
        19 => c == '.',
        23 => c == 'Z',
        _ => c.is_ascii_digit(),
    });
    since.len() == 24 && shape
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_names_the_leader_and_labels_its_fencing_token_as_the_term() {
    let server = RedisServer::start();
    let a = client(&server, "replica-a").await;
    let leading = a.campaign("scheduler", TTL).await.unwrap();
    let term = leading.term();

    let out = lockctl(&server, &["show", "scheduler"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(shown.contains("holder:        replica-a\n"), "{shown}");
    assert!(
        shown.contains(&format!("fencing token: {term} (leader term)\n")),
        "{shown}"
    );
    let held_for = shown.lines().find(|l| l.starts_with("held for:")).unwrap();
    let (_, since) = held_for.split_once("(since ").unwrap();
    assert!(is_utc(since.trim_end_matches(')')), "{held_for}");

    let out = lockctl(&server, &["--json", "show", "scheduler"]);
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["holder"], "replica-a");
    assert_eq!(shown["term"], term);
    assert_eq!(shown["fencing_token"], term);
    assert!(is_utc(shown["since"].as_str().unwrap()), "{shown}");

    // A lock taken without fencing has no term.
    let _plain = a.lock("plain", TTL).await.unwrap();
    let out = lockctl(&server, &["show", "plain"]);
    assert!(text(&out.stdout).contains("fencing token: none\n"));
    let out = lockctl(&server, &["--json", "show", "plain"]);
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(shown["term"].is_null(), "{shown}");
    leading.resign().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_each_new_leader_with_its_term_until_ctrl_c() {
    let server = RedisServer::start();
    let a = client(&server, "replica-a").await;
    let b = client(&server, "replica-b").await;
    let first = a.campaign("scheduler", TTL).await.unwrap();
    let first_term = first.term();

    let (mut child, next_line) = watching(&server, &["watch", "scheduler"]);
    let line = next_line();
    assert!(
        line.starts_with("scheduler: held by replica-a (for "),
        "{line}"
    );
    let (_, since) = line
        .split_once(&format!(" left), term {first_term}, since "))
        .unwrap_or_else(|| panic!("no term {first_term}: {line}"));
    assert!(is_utc(since), "{line}");

    let campaign = tokio::spawn(async move { b.campaign("scheduler", TTL).await });
    first.resign().await.unwrap();
    let second = campaign.await.unwrap().unwrap();
    // The key may be seen free for the moment between the two leaders.
    let mut line = next_line();
    if line == "scheduler: free" {
        line = next_line();
    }
    assert!(
        line.starts_with("scheduler: held by replica-b (for "),
        "{line}"
    );
    let term = format!(", term {}, since ", second.term());
    assert!(second.term() > first_term && line.contains(&term), "{line}");

    // Ctrl-C ends the watch, as a success.
    let interrupt = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(interrupt.success());
    assert!(child.wait().unwrap().success());

    // JSON: one object per line, with the term; --changes bounds it.
    let out = lockctl(&server, &["--json", "watch", "scheduler", "--changes", "1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let seen: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(seen["holder"], "replica-b");
    assert_eq!(seen["term"], second.term());
    second.resign().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_counts_shared_holders_as_they_come_and_go() {
    let server = RedisServer::start();
    let a = client(&server, "reader-a").await;
    let shared = || LockOptions::new(TTL).shared(true);
    let one = a.lock_with("catalog", shared()).await.unwrap();

    let (mut child, next_line) = watching(&server, &["watch", "catalog", "--interval-ms", "50"]);
    assert_eq!(
        next_line().split_once(" (").unwrap().0,
        "catalog: held by 1 shared holders"
    );
    let two = a.lock_with("catalog", shared()).await.unwrap();
    assert_eq!(
        next_line().split_once(" (").unwrap().0,
        "catalog: held by 2 shared holders"
    );
    two.release().await.unwrap();
    assert_eq!(
        next_line().split_once(" (").unwrap().0,
        "catalog: held by 1 shared holders"
    );
    one.release().await.unwrap();
    assert_eq!(next_line(), "catalog: free");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn bad_url_unreachable_server_and_wrong_password_are_one_line_errors() {
    let run = |url: &str| {
        Command::new(env!("CARGO_BIN_EXE_lockctl"))
            .args(["--url", url, "--timeout-ms", "500", "list"])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let check = |out: &Output, needle: &str| {
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        let err = text(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.starts_with("lockctl: error:"), "{err}");
        assert!(err.to_lowercase().contains(needle), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    };
    check(&run("http://nowhere"), "url");
    check(&run("127.0.0.1:7600"), "write it as redis://127.0.0.1:7600");
    // A port nobody listens on: a server started and stopped.
    let mut gone = RedisServer::start();
    let url = gone.url();
    gone.stop();
    check(&run(&url), "reach");
    let secured = RedisServer::builder().password("right-one").start();
    let url = format!("redis://:wrong-one@127.0.0.1:{}", secured.port());
    check(&run(&url), "pass");
}

/// The rules of the documented user `user` (docs/deployment.md, "Redis
/// ACL": the page's `ACL SETUSER <user> reset on >password ...` line), for
/// the prefix `app:` instead of `lock:`.
fn documented_rules(user: &str) -> Vec<String> {
    const DOC: &str = include_str!("../../docs/deployment.md");
    let head = format!("ACL SETUSER {user} reset on >");
    let line = DOC
        .lines()
        .find(|line| line.starts_with(&head))
        .unwrap_or_else(|| panic!("docs/deployment.md has no line {head:?}..."));
    line.split_whitespace()
        .skip(6)
        .map(|rule| rule.replace("~lock:", "~app:").replace("&lock:", "&app:"))
        .collect()
}

/// `lockctl` under the documented operator's user: it lists, shows,
/// watches and breaks exclusive locks, shared locks, permits and a
/// leader's lease held under the documented lock client's user, and the
/// server refuses neither of them anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_runs_under_the_documented_operator_user() {
    let server = RedisServer::builder().password("admin-secret").start();
    for user in ["locker", "lock-operator"] {
        let password = format!(">{user}-pw");
        let mut args = vec!["ACL", "SETUSER", user, "reset", "on", &password];
        let rules = documented_rules(user);
        args.extend(rules.iter().map(String::as_str));
        let _: () = server.cmd(&args);
    }
    let as_user = |user: &str| format!("redis://{user}:{user}-pw@127.0.0.1:{}", server.port());
    let locker = LockClient::builder()
        .url(as_user("locker"))
        .key_prefix("app:")
        .holder_name("billing-7")
        .build()
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", server.log()));
    let _one = locker.lock("order:1", TTL).await.unwrap();
    let _shared = locker
        .lock_with("catalog", LockOptions::new(TTL).shared(true))
        .await
        .unwrap();
    let _permit = locker
        .lock_with("pool", LockOptions::new(TTL).permits(3))
        .await
        .unwrap();
    let leader = locker.campaign("scheduler", TTL).await.unwrap();

    let operator = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_lockctl"))
            .args(["--url", &as_user("lock-operator"), "--prefix", "app:"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("lockctl runs")
    };
    let out = operator(&["list"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    for key in ["order:1", "catalog", "pool", "scheduler"] {
        assert!(table.contains(key), "{key} not in {table}");
    }
    for key in ["order:1", "catalog", "pool", "scheduler"] {
        let out = operator(&["show", key]);
        assert!(out.status.success(), "{key}: {}", text(&out.stderr));
    }
    let out = operator(&["watch", "scheduler", "--changes", "1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("billing-7"),
        "{}",
        text(&out.stdout)
    );
    for key in ["order:1", "catalog", "pool"] {
        let out = operator(&["release", key, "--force"]);
        assert!(out.status.success(), "{key}: {}", text(&out.stderr));
    }
    let out = operator(&["show", "order:1"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    leader.resign().await.unwrap();

    // Each entry as its fields and values; the redis crate's `CLIENT
    // SETINFO`, which it sends and ignores a refusal of, aside.
    let log: Vec<Vec<String>> = server.cmd(&["ACL", "LOG"]);
    let refused: Vec<Vec<String>> = log
        .into_iter()
        .filter(|entry| !entry.iter().any(|field| field == "client|setinfo"))
        .collect();
    assert!(refused.is_empty(), "the ACL refused: {refused:#?}");
}
