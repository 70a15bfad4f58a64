//! W10's campaigners and the register their leaders write.
//!
//! | [`Impl`] | campaigning | resigning | the leader's write |
//! | --- | --- | --- | --- |
//! | `Guard` | `LockClient::campaign` (renewed while leading) | `Leadership::resign` | fenced: a Lua compare-and-set on the term |
//! | `Rslock` | `LockManager::acquire_no_guard`: `lock()` with its default retries, called again until it succeeds | `LockManager::unlock` | a plain `SET`: rslock has no fencing tokens |
//!
//! rslock's `acquire_no_guard` is the campaign loop a user of rslock writes
//! (and the one rslock ships); it does not renew, and no W10 leader leads
//! for as long as its lease.

use crate::contenders::{Impl, lock_core_client};
use crate::error::{BenchResult, fail};
use crate::servers::connect;
use crate::stats::wall_ns;
use lock_core::{Leadership, LockClient};
use redis::aio::MultiplexedConnection;
use std::time::Duration;

/// Writes `ARGV[2]` to the register `KEYS[1]` (a hash) with the term
/// `ARGV[1]`, only when that term is above the register's: 1 when written,
/// 0 when refused (a later leader has written).
const FENCED_WRITE: &str = r#"local current = tonumber(redis.call("HGET", KEYS[1], "term") or "0")
if tonumber(ARGV[1]) <= current then
  return 0
end
redis.call("HSET", KEYS[1], "term", ARGV[1], "value", ARGV[2])
return 1"#;

/// One campaigner: its own client and its own connection to the register.
#[derive(Clone)]
pub struct Campaigner {
    elector: Elector,
    register: Register,
}

/// The library a campaigner campaigns with.
#[derive(Clone)]
enum Elector {
    LockCore(LockClient),
    Rslock(rslock::LockManager),
}

/// What a campaigner holds while it leads.
pub enum Lead {
    /// lock-core's leadership, renewed in the background.
    LockCore(Leadership),
    /// rslock's lock, and the manager that unlocks it.
    Rslock(rslock::LockManager, rslock::Lock),
}

/// The register the leaders write, on a connection of one campaigner.
#[derive(Clone)]
struct Register {
    conn: MultiplexedConnection,
    key: String,
    fenced: Option<redis::Script>,
}

/// A campaigner that leads: what it holds, and its first write.
pub struct Elected {
    /// Which campaigner of its pool.
    pub index: usize,
    /// The leadership, still held.
    pub lead: Lead,
    /// When the reply to its first write arrived ([`wall_ns`]).
    pub written: u64,
    /// Whether that write was accepted (always, unfenced).
    pub accepted: bool,
}

impl Campaigner {
    /// A campaigner of `imp` (`Guard` or `Rslock`) on the server `url`,
    /// whose leaders write the register `register`.
    pub async fn connect(imp: Impl, url: &str, register: &str) -> BenchResult<Campaigner> {
        let elector = match imp {
            Impl::Guard => Elector::LockCore(lock_core_client(&[url.to_owned()]).await?),
            Impl::Rslock => Elector::Rslock(rslock::LockManager::from_clients(vec![
                redis::Client::open(url)?,
            ])),
            other => return Err(fail(format!("{} does not campaign", other.label()))),
        };
        let register = Register {
            conn: connect(url).await?,
            key: register.to_owned(),
            fenced: (imp == Impl::Guard).then(|| redis::Script::new(FENCED_WRITE)),
        };
        Ok(Campaigner { elector, register })
    }

    /// The key this campaigner's library campaigns on for the election
    /// `name` (lock-core adds its prefix), and that key as stored in Redis.
    pub fn keys(&self, name: &str) -> BenchResult<(String, String)> {
        Ok(match &self.elector {
            Elector::LockCore(client) => (name.to_owned(), client.storage_key(name)?),
            Elector::Rslock(_) => {
                let key = format!("bench:rslock:{name}");
                (key.clone(), key)
            }
        })
    }

    /// Campaigns for `key` with a lease of `ttl` until it leads, then
    /// writes the register once (fenced with its term where there is one).
    pub async fn lead(mut self, index: usize, key: &str, ttl: Duration) -> BenchResult<Elected> {
        let lead = match &self.elector {
            Elector::LockCore(client) => Lead::LockCore(client.campaign(key, ttl).await?),
            Elector::Rslock(manager) => {
                let lock = manager
                    .acquire_no_guard(key.as_bytes(), ttl)
                    .await
                    .map_err(|e| fail(format!("rslock: {e}")))?;
                Lead::Rslock(manager.clone(), lock)
            }
        };
        let accepted = self.register.write(lead.term(), index).await?;
        Ok(Elected {
            index,
            lead,
            written: wall_ns(),
            accepted,
        })
    }
}

impl Lead {
    /// The leader's term: lock-core's fencing token; rslock has none.
    pub fn term(&self) -> Option<u64> {
        match self {
            Lead::LockCore(leadership) => Some(leadership.term()),
            Lead::Rslock(..) => None,
        }
    }

    /// Steps down: the next campaigner may lead.
    pub async fn resign(self) -> BenchResult<()> {
        match self {
            Lead::LockCore(leadership) => {
                if !leadership.resign().await? {
                    return Err(fail("a W10 leader had lost its lease before resigning"));
                }
            }
            Lead::Rslock(manager, lock) => manager.unlock(&lock).await,
        }
        Ok(())
    }
}

impl Register {
    /// Writes the campaigner's `index` with `term`: fenced when there is a
    /// term (`Ok(false)` when refused), a plain `SET` otherwise.
    async fn write(&mut self, term: Option<u64>, index: usize) -> BenchResult<bool> {
        let value = format!("campaigner {index}");
        match (&self.fenced, term) {
            (Some(script), Some(term)) => {
                let written: i64 = script
                    .key(&self.key)
                    .arg(term)
                    .arg(value)
                    .invoke_async(&mut self.conn)
                    .await?;
                Ok(written == 1)
            }
            _ => {
                let () = redis::cmd("SET")
                    .arg(&self.key)
                    .arg(value)
                    .query_async(&mut self.conn)
                    .await?;
                Ok(true)
            }
        }
    }
}
