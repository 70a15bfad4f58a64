//! What operators see in their logs: tracing spans and events.
//!
//! A test binary of its own with one test: a subscriber set for one thread
//! must not race with other threads hitting the same callsites first.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use lock_core::{ErrorKind, LockClient, LockClientBuilder, LockOptions};
use lock_testkit::RedisServer;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::client_with;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// A closed span or an event, with its fields as text.
#[derive(Clone, Debug)]
struct Seen {
    name: String,
    level: Level,
    fields: HashMap<String, String>,
}

#[derive(Clone, Default)]
struct Capture {
    spans: Arc<Mutex<Vec<Seen>>>,
    events: Arc<Mutex<Vec<Seen>>>,
}

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = HashMap::new();
        attrs.record(&mut Fields(&mut fields));
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(fields) = span.extensions_mut().get_mut::<HashMap<String, String>>()
        {
            values.record(&mut Fields(fields));
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(&id) {
            let fields = span
                .extensions()
                .get::<HashMap<String, String>>()
                .cloned()
                .unwrap_or_default();
            self.spans.lock().unwrap().push(Seen {
                name: span.name().to_owned(),
                level: *span.metadata().level(),
                fields,
            });
        }
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut fields = HashMap::new();
        event.record(&mut Fields(&mut fields));
        self.events.lock().unwrap().push(Seen {
            name: fields.get("message").cloned().unwrap_or_default(),
            level: *event.metadata().level(),
            fields,
        });
    }
}

/// The clients of this file.
fn settings() -> LockClientBuilder {
    LockClient::builder()
        .key_prefix("obs:")
        .operation_timeout(Duration::from_millis(300))
}

#[tokio::test]
async fn spans_and_events_name_the_key_and_never_the_token() {
    let capture = Capture::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let mut server = RedisServer::start();
    let client = client_with(&server, settings()).await;
    let other_process = client_with(&server, settings()).await;

    let held = client
        .lock("order:1", Duration::from_secs(5))
        .await
        .unwrap();
    let value: String = server.cmd(&["GET", "obs:{order:1}"]);
    // The value names the holder after the token (docs/format.md); the
    // token is what must never be logged.
    let token = value.split('|').next().unwrap().to_owned();
    let err = other_process
        .lock_with(
            "order:1",
            LockOptions::new(Duration::from_secs(5)).wait(Duration::from_millis(150)),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Contended);
    assert!(held.release().await.unwrap());

    // Taken over under a held guard: the next renewal notices.
    let taken = client
        .lock("order:2", Duration::from_millis(300))
        .await
        .unwrap();
    let _: () = server.cmd(&["SET", "obs:{order:2}", "intruder"]);
    tokio::time::timeout(Duration::from_secs(2), taken.lost())
        .await
        .unwrap();

    // An operator breaks a lock: a WARN names the evicted holder.
    let broken = client
        .lock("order:4", Duration::from_secs(5))
        .await
        .unwrap();
    assert!(other_process.force_release("order:4").await.unwrap());
    drop(broken);

    // Redis gone under a held guard: renewals fail, then the lease is lost.
    let stranded = client
        .lock("order:3", Duration::from_millis(300))
        .await
        .unwrap();
    server.stop();
    tokio::time::timeout(Duration::from_secs(2), stranded.lost())
        .await
        .unwrap();
    drop((taken, stranded));

    let spans = capture.spans.lock().unwrap().clone();
    let locks: Vec<&Seen> = spans.iter().filter(|s| s.name == "lock").collect();
    let acquired = locks
        .iter()
        .find(|s| s.fields.get("outcome").map(String::as_str) == Some("acquired"))
        .expect("a span for the acquisition");
    assert_eq!(acquired.fields["key"], "order:1");
    assert_eq!(acquired.fields["attempts"], "1");
    assert_eq!(acquired.level, Level::DEBUG);
    let contended = locks
        .iter()
        .find(|s| s.fields.get("outcome").map(String::as_str) == Some("contended"))
        .expect("a span for the contended acquisition");
    assert!(
        contended.fields["attempts"].parse::<u32>().unwrap() > 1,
        "{contended:?}"
    );
    assert!(contended.fields["waited_ms"].parse::<u64>().unwrap() >= 150);

    let events = capture.events.lock().unwrap().clone();
    let find = |message: &str, key: &str| {
        events
            .iter()
            .find(|e| e.name == message && e.fields.get("key").map(String::as_str) == Some(key))
            .unwrap_or_else(|| panic!("no {message:?} event for {key}: {events:#?}"))
    };
    let retry = find("lock busy, retrying", "order:1");
    assert_eq!(retry.level, Level::DEBUG);
    let released = find("lock released", "order:1");
    assert_eq!(released.fields["owned"], "true");
    let lost = find("lock lost", "order:2");
    assert_eq!(lost.level, Level::WARN);
    assert!(lost.fields["reason"].contains("taken over"), "{lost:?}");
    let failed = find("lock renewal failed", "order:3");
    assert_eq!(failed.level, Level::WARN);
    assert!(!failed.fields["error"].is_empty());
    let lost = find("lock lost", "order:3");
    assert!(lost.fields["reason"].contains("deadline"), "{lost:?}");

    let forced = find(
        "lock force-released; its holder loses it at its next renewal",
        "order:4",
    );
    assert_eq!(forced.level, Level::WARN);
    let pid = format!(":{}", std::process::id());
    assert!(forced.fields["holder"].ends_with(&pid), "{forced:?}");

    let everything = format!("{spans:?}{events:?}");
    assert!(!everything.contains(&token), "a token was logged");
}
