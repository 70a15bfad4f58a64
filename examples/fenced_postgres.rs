//! Fencing a real database's writes with an election's term: the outbox
//! relay of docs/leader.md, on PostgreSQL. One replica at a time leads the
//! election `outbox-relay`; the leader moves the relay's position
//! (`last_id`) on with the fenced write of docs/leader.md, which carries
//! its term and lands only if no newer leader has written:
//!
//! ```sql
//! UPDATE relay_state SET last_id = $1, term = $2
//!  WHERE name = 'outbox' AND term <= $2   -- 0 rows: a newer leader has written
//! ```
//!
//! In the first run three replicas lead in turn, and each one's write
//! lands. In the second, replica D leads, reads the position, and stops
//! dead before writing (a process of its own that sends itself SIGSTOP, as
//! a long GC pause or a suspended VM would stop it), past its lease's ttl.
//! Replica B leads meanwhile and writes with its larger term. When D goes
//! on (SIGCONT) it still believes it leads and writes: 0 rows, refused.
//! B, still the leader, writes again with its term, and that lands. The
//! example exits non-zero if anything else happens.
//!
//! ```text
//! cargo run --example fenced_postgres    # throwaway redis-server and PostgreSQL
//! REDIS_URL=redis://127.0.0.1:6379 DATABASE_URL=postgres://me@localhost/db \
//!   cargo run --example fenced_postgres  # or yours (it creates and resets relay_state)
//! ```
//!
//! Without `DATABASE_URL` it starts PostgreSQL from Debian's `postgresql`
//! package (`apt-get install postgresql`; as root, it runs the server as
//! the `postgres` user). Needs a Unix system with the `kill` command.

use lock_core::{Leadership, LockClient};
use std::process::ExitCode;
use std::time::Duration;
use tokio_postgres::{Client, NoTls};

#[path = "support/pause.rs"]
mod pause;
#[path = "support/postgres.rs"]
mod postgres_for_example;
#[path = "support/redis.rs"]
mod redis_for_example;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The election every replica campaigns in.
const ELECTION: &str = "outbox-relay";
/// The leader's lease.
const TTL: Duration = Duration::from_secs(1);
/// The longest a campaign may take here (a crashed or paused leader is
/// followed within the ttl).
const BOUND: Duration = Duration::from_secs(20);
/// The argument that makes this program run 2's replica D.
const STALE_LEADER: &str = "stale-leader";
/// How far one write moves the relay on.
const BATCH: i64 = 10;

// ---------------------------------------------------------------------------
// The table and the fenced write, as in docs/leader.md.
// ---------------------------------------------------------------------------

/// Creates the relay's row, or puts it back at the start.
async fn reset(db: &Client) -> Result<(), tokio_postgres::Error> {
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS relay_state (
             name    text PRIMARY KEY,
             last_id bigint NOT NULL,
             term    bigint NOT NULL  -- 64 bits: terms are microsecond-scale
         );
         INSERT INTO relay_state VALUES ('outbox', 0, 0)
             ON CONFLICT (name) DO UPDATE SET last_id = 0, term = 0;",
    )
    .await
}

/// Where the relay stands: (last_id, the term of the last write).
async fn position(db: &Client) -> Result<(i64, i64), tokio_postgres::Error> {
    let row = db
        .query_one(
            "SELECT last_id, term FROM relay_state WHERE name = 'outbox'",
            &[],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// The fenced write: `last_id` with `term`, only if no newer term has
/// written. `Ok(false)`: 0 rows, refused.
async fn fenced_write(db: &Client, last_id: i64, term: u64) -> Result<bool, BoxError> {
    // A term is below 2^63 (the server's clock in microseconds and up), so
    // it fits BIGINT.
    let term = i64::try_from(term)?;
    let rows = db
        .execute(
            "UPDATE relay_state SET last_id = $1, term = $2
              WHERE name = 'outbox' AND term <= $2",
            &[&last_id, &term],
        )
        .await?;
    Ok(rows == 1)
}

// ---------------------------------------------------------------------------
// Replicas.
// ---------------------------------------------------------------------------

async fn connect(database: &str) -> Result<Client, BoxError> {
    let (db, connection) = tokio_postgres::connect(database, NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("PostgreSQL connection: {e}");
        }
    });
    Ok(db)
}

async fn locks(redis: &str, name: &str) -> Result<LockClient, BoxError> {
    Ok(LockClient::builder()
        .url(redis)
        .key_prefix("fenced-postgres:")
        .holder_name(format!("replica-{name}"))
        .build()
        .await?)
}

async fn lead(locks: &LockClient) -> Result<Leadership, BoxError> {
    Ok(tokio::time::timeout(BOUND, locks.campaign(ELECTION, TTL))
        .await
        .map_err(|_| "no leadership within the bound")??)
}

/// One batch relayed by the leader: reads the position, writes it moved on.
async fn relay(name: &str, db: &Client, leadership: &Leadership) -> Result<bool, BoxError> {
    let term = leadership.term();
    let (last_id, _) = position(db).await?;
    let landed = fenced_write(db, last_id + BATCH, term).await?;
    println!(
        "  replica {name}: term {term}, last_id {last_id} -> {}: {}",
        last_id + BATCH,
        if landed {
            "written"
        } else {
            "refused (0 rows)"
        }
    );
    Ok(landed)
}

/// Run 2's replica D, in the process [`paused_run`] starts: leads, reads,
/// stops dead, then writes. Exits 0 when its write was refused.
async fn stale_leader(redis: &str, database: &str) -> Result<ExitCode, BoxError> {
    let (locks, db) = (locks(redis, "D").await?, connect(database).await?);
    let leadership = lead(&locks).await?;
    let term = leadership.term();
    let (last_id, _) = position(&db).await?;
    pause::stop_dead(&format!(
        "  replica D: leads with term {term}, reads last_id {last_id}"
    ));
    let landed = fenced_write(&db, last_id + BATCH, term).await?;
    println!(
        "  replica D: wakes up and writes last_id {} with term {term}: {}",
        last_id + BATCH,
        if landed {
            "written"
        } else {
            "refused (0 rows): a newer leader has written"
        }
    );
    Ok(if landed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

// ---------------------------------------------------------------------------
// The two runs.
// ---------------------------------------------------------------------------

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [role, redis, database] = &args[..]
        && role == STALE_LEADER
    {
        return stale_leader(redis, database).await;
    }

    let redis = redis_for_example::redis_url()?;
    let postgres = postgres_for_example::postgres().await?;
    let (redis, database) = (redis.url(), postgres.config());
    let db = connect(&database).await?;
    reset(&db).await?;
    let mut unexpected = Vec::new();

    println!("\nrun 1: replicas A, B and C lead in turn; each one's write lands");
    let mut terms = Vec::new();
    for name in ["A", "B", "C"] {
        let locks = locks(&redis, name).await?;
        let leadership = lead(&locks).await?;
        if !relay(name, &db, &leadership).await? {
            unexpected.push(format!("{name}'s write, as the leader, was refused"));
        }
        terms.push(leadership.term());
        leadership.resign().await?;
    }
    if !terms.is_sorted_by(|a, b| a < b) {
        unexpected.push(format!("the terms did not grow: {terms:?}"));
    }

    println!("\nrun 2: replica D leads and stops dead before its write, past the ttl");
    let (refused, b_term) = paused_run(&redis, &database, &db, &mut unexpected).await?;
    if !refused {
        unexpected.push("D's stale write was not refused".to_owned());
    }

    let (last_id, term) = position(&db).await?;
    println!("\nlast_id {last_id}, written with term {term}");
    if last_id != 5 * BATCH || i64::try_from(b_term)? != term {
        unexpected.push(format!(
            "expected last_id {} with B's term {b_term}: five writes landed, D's did not",
            5 * BATCH
        ));
    }
    if !unexpected.is_empty() {
        for what in unexpected {
            println!("unexpected: {what}");
        }
        return Ok(ExitCode::FAILURE);
    }
    println!("the stale leader's write was refused: its term was below the one B had written");
    Ok(ExitCode::SUCCESS)
}

/// Starts replica D in a process of its own and waits until it has stopped
/// dead; B leads once D's lease has run out (nobody renews it) and writes;
/// D goes on and is refused; B writes again. Returns whether D's write was
/// refused (D's exit code says), and B's term.
async fn paused_run(
    redis: &str,
    database: &str,
    db: &Client,
    unexpected: &mut Vec<String>,
) -> Result<(bool, u64), BoxError> {
    let mut d = pause::PausedReplica::start(&[STALE_LEADER, redis, database])?;
    d.stopped().await?;

    let b = locks(redis, "B").await?;
    let leadership = lead(&b).await?;
    if !relay("B", db, &leadership).await? {
        unexpected.push("B's write, as the new leader, was refused".to_owned());
    }
    let refused = d.resume_and_wait().await?;
    if !relay("B", db, &leadership).await? {
        unexpected.push("B's second write, still the leader, was refused".to_owned());
    }
    let term = leadership.term();
    leadership.resign().await?;
    Ok((refused, term))
}
