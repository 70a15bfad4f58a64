//! What lockctl prints: a table or lines for people, JSON for scripts.

use lock_core::{LockKind, LockState};
use serde_json::{Value, json};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `list`: one row per lock. When there is none, says where it looked:
/// a wrong `--prefix` finds nothing.
pub(crate) fn list(locks: &[LockState], json: bool, prefix: &str, pattern: Option<&str>) {
    if json {
        let rows: Vec<Value> = locks.iter().map(state_json).collect();
        println!("{}", Value::Array(rows));
        return;
    }
    if locks.is_empty() {
        let matching = pattern.map_or_else(String::new, |p| format!(" matching {p:?}"));
        println!(
            "no locks held under the prefix {prefix:?}{matching} \
             (--prefix is the services' key prefix, default \"lock:\")"
        );
        return;
    }
    let header = [
        "KEY".to_owned(),
        "HOLDER".to_owned(),
        "HELD FOR".to_owned(),
        "REMAINING".to_owned(),
        "FENCING TOKEN".to_owned(),
        "WAITING".to_owned(),
    ];
    let rows: Vec<[String; 6]> = locks
        .iter()
        .map(|s| {
            [
                s.key().to_owned(),
                holder_text(s),
                duration_or(s.held_for(), "-"),
                remaining_text(s),
                s.fencing_token().map_or("-".to_owned(), |f| f.to_string()),
                s.waiting().to_string(),
            ]
        })
        .collect();
    let mut widths = header.clone().map(|h| h.chars().count());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        println!("{}", cells.join("  ").trim_end());
    }
}

/// `show`: the lock's fields, one per line.
pub(crate) fn show(state: &LockState, json: bool) {
    if json {
        println!("{}", state_json(state));
        return;
    }
    println!("key:           {}", state.key());
    println!("kind:          {}", kind_text(state.kind()));
    println!("holder:        {}", holder_text(state));
    let since = since(state).map_or_else(String::new, |since| format!(" (since {since})"));
    println!(
        "held for:      {}{since}",
        duration_or(state.held_for(), "unknown")
    );
    println!("remaining:     {}", remaining_text(state));
    let fence = match (state.fencing_token(), term(state)) {
        (_, Some(term)) => format!("{term} (leader term)"),
        (Some(fence), None) => fence.to_string(),
        (None, None) => "none".to_owned(),
    };
    println!("fencing token: {fence}");
    println!("waiting:       {}", waiting_text(state));
    for waiter in state.waiters() {
        println!("  {} for {}", waiter.holder(), human(waiter.waited()));
    }
}

/// How many wait, as `show` says it.
fn waiting_text(state: &LockState) -> String {
    match state.waiting() {
        0 => "nobody".to_owned(),
        1 => "1 task".to_owned(),
        n => format!("{n} tasks"),
    }
}

/// `show` of a free key.
pub(crate) fn free(key: &str, json: bool) {
    if json {
        println!("{}", json!({ "key": key, "held": false }));
    } else {
        println!("{key} is free");
    }
}

/// `release`: who was evicted, if anyone.
pub(crate) fn released(key: &str, evicted: Option<&LockState>, json: bool) {
    if json {
        println!(
            "{}",
            json!({
                "key": key,
                "released": evicted.is_some(),
                "evicted": evicted.map(state_json),
            })
        );
        return;
    }
    match evicted {
        Some(state) => println!(
            "released {key}: evicted {} (held for {}, {}, fencing token {})",
            holder_text(state),
            duration_or(state.held_for(), "an unknown time"),
            if state.expires() {
                format!("{} left", human(state.remaining()))
            } else {
                "no expiry".to_owned()
            },
            state
                .fencing_token()
                .map_or("none".to_owned(), |f| f.to_string()),
        ),
        None => println!("{key} was not held; nothing released"),
    }
}

/// `watch`: one line for a change of holder.
pub(crate) fn change(key: &str, state: Option<&LockState>, json: bool) {
    if json {
        let line = match state {
            Some(state) => state_json(state),
            None => json!({ "key": key, "held": false }),
        };
        println!("{line}");
        return;
    }
    let Some(state) = state else {
        println!("{key}: free");
        return;
    };
    let mut line = format!(
        "{key}: held by {} (for {}, {} left)",
        holder_text(state),
        duration_or(state.held_for(), "an unknown time"),
        remaining_text(state)
    );
    if let Some(term) = term(state) {
        line.push_str(&format!(", term {term}"));
    }
    if let Some(since) = since(state) {
        line.push_str(&format!(", since {since}"));
    }
    println!("{line}");
}

/// The term of the key's leader, when it is an election: the fencing
/// token of an exclusive holder (a leader is the holder of a fenced lease,
/// and its term that lease's token).
fn term(state: &LockState) -> Option<u64> {
    match state.kind() {
        LockKind::Exclusive => state.fencing_token(),
        _ => None,
    }
}

/// When the holder took the key, in UTC by this machine's clock: now less
/// how long the server says it has been held.
fn since(state: &LockState) -> Option<String> {
    let held = state.held_for()?;
    let taken = SystemTime::now().checked_sub(held)?;
    Some(utc(taken))
}

/// `2026-12-03T16:19:34.123Z`.
fn utc(time: SystemTime) -> String {
    let ms = time
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let (days, ms) = (ms / 86_400_000, ms % 86_400_000);
    let (year, month, day) = civil_date(days);
    let (hours, minutes) = (ms / 3_600_000, ms / 60_000 % 60);
    let (seconds, millis) = (ms / 1000 % 60, ms % 1000);
    format!("{year:04}-{month:02}-{day:02}T{hours:02}:{minutes:02}:{seconds:02}.{millis:03}Z")
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, for days on or after the epoch).
fn civil_date(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// What tells one holding from the next, for `watch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holding {
    kind: LockKind,
    holder: Option<String>,
    fence: Option<u64>,
    holders: u64,
    /// When it was taken, by this machine's clock (from `held_for`).
    since: Option<std::time::SystemTime>,
}

impl Holding {
    /// Whether the holders of this holding come and go without a change of
    /// leader: shared holders and permits.
    pub(crate) fn is_counted(&self) -> bool {
        matches!(self.kind, LockKind::Shared | LockKind::Permits(_))
    }

    pub(crate) fn of(state: &LockState) -> Holding {
        Holding {
            kind: state.kind(),
            holder: state.holder().map(str::to_owned),
            fence: state.fencing_token(),
            holders: state.holders(),
            since: state
                .held_for()
                .and_then(|held| std::time::SystemTime::now().checked_sub(held)),
        }
    }

    /// Whether two looks saw the same holding: the same holder, taken at
    /// the same time give or take the clocks' jitter.
    pub(crate) fn same(a: Option<&Holding>, b: Option<&Holding>) -> bool {
        match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => {
                let close = match (a.since, b.since) {
                    (Some(x), Some(y)) => {
                        let gap = x.duration_since(y).or_else(|_| y.duration_since(x));
                        gap.is_ok_and(|gap| gap < Duration::from_millis(250))
                    }
                    (None, None) => true,
                    _ => false,
                };
                a.kind == b.kind
                    && a.holder == b.holder
                    && a.fence == b.fence
                    && a.holders == b.holders
                    && close
            }
            _ => false,
        }
    }
}

fn state_json(state: &LockState) -> Value {
    json!({
        "key": state.key(),
        "held": true,
        "kind": kind_text(state.kind()),
        "holder": state.holder(),
        "holders": state.holders(),
        "held_for_ms": state.held_for().map(millis),
        "remaining_ms": state.expires().then(|| millis(state.remaining())),
        "fencing_token": state.fencing_token(),
        "term": term(state),
        "since": since(state),
        "waiting": state.waiting(),
        "waiters": state
            .waiters()
            .iter()
            .map(|w| json!({"holder": w.holder(), "waited_ms": millis(w.waited())}))
            .collect::<Vec<_>>(),
    })
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn kind_text(kind: LockKind) -> String {
    match kind {
        LockKind::Exclusive => "exclusive".to_owned(),
        LockKind::Shared => "shared".to_owned(),
        LockKind::Permits(n) => format!("permits:{n}"),
        LockKind::Foreign => "not a lock".to_owned(),
        _ => "unknown".to_owned(),
    }
}

fn holder_text(state: &LockState) -> String {
    match (state.kind(), state.holder()) {
        (_, Some(holder)) => holder.to_owned(),
        (LockKind::Shared, None) => format!("{} shared holders", state.holders()),
        (LockKind::Permits(n), None) => format!("{} of {n} permits", state.holders()),
        (LockKind::Foreign, None) => "(not a lock)".to_owned(),
        _ => "(unnamed)".to_owned(),
    }
}

fn remaining_text(state: &LockState) -> String {
    if state.expires() {
        human(state.remaining())
    } else {
        "never expires".to_owned()
    }
}

/// `d` for people, or `otherwise` when unknown.
pub(crate) fn duration_or(d: Option<Duration>, otherwise: &str) -> String {
    d.map_or_else(|| otherwise.to_owned(), human)
}

/// 850ms, 12.3s, 4m05s, 2h03m.
fn human(d: Duration) -> String {
    let ms = d.as_millis();
    let secs = d.as_secs();
    if ms < 1000 {
        format!("{ms}ms")
    } else if secs < 60 {
        format!("{:.1}s", d.as_secs_f64())
    } else if secs < 3600 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        format!("{}h{:02}m", secs / 3600, (secs % 3600) / 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_times_read_as_rfc_3339() {
        let at = |ms: u64| utc(UNIX_EPOCH + Duration::from_millis(ms));
        assert_eq!(at(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(at(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(at(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
    }
}
