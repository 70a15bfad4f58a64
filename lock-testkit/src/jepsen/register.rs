//! The fenced register: the resource the workers protect with the lock, a
//! counter on a `redis-server` of its own that checks fencing tokens.

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Script};

use super::history::OpKind;
use crate::{RedisServer, TestkitError};

/// The hash that holds the counter (`value`) and the highest token seen
/// (`max_seen`).
pub const REGISTER_KEY: &str = "jepsen:register";
/// The list where the register logs every operation it answers, in the
/// order it answered them.
pub const LOG_KEY: &str = "jepsen:register:log";

/// One operation, atomically: a fenced one is refused when its token is
/// below the highest seen, and otherwise raises the highest seen to it, a
/// read as well as a write. Checking writes alone is not enough: holders
/// with tokens 1 and 2 could read, read, then write 2 before 1, and the
/// first write would be lost although both tokens pass. An unfenced
/// operation (empty token) is never refused and changes nothing but the
/// value.
///
/// `KEYS[1]` register, `KEYS[2]` log, `ARGV[1]` `read` or `write`,
/// `ARGV[2]` token or empty, `ARGV[3]` value to write, `ARGV[4]` tag.
/// Answers `{1, value}` (the value read or written) or `{0, max_seen}`.
/// Tokens are below 2^53, exact as Lua numbers.
static OPERATION: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"local token = ARGV[2]
local shown = token
if token == "" then
  shown = "-"
else
  local seen = redis.call("HGET", KEYS[1], "max_seen")
  if seen and tonumber(token) < tonumber(seen) then
    redis.call("RPUSH", KEYS[2], ARGV[1] .. " rejected " .. token .. " - " .. ARGV[4])
    return {0, seen}
  end
  redis.call("HSET", KEYS[1], "max_seen", token)
end
local value
if ARGV[1] == "write" then
  value = ARGV[3]
  redis.call("HSET", KEYS[1], "value", value)
else
  value = redis.call("HGET", KEYS[1], "value") or "0"
end
redis.call("RPUSH", KEYS[2], ARGV[1] .. " accepted " .. shown .. " " .. value .. " " .. ARGV[4])
return {1, value}"#,
    )
});

/// The register's answer to one operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Done: the value read, or written.
    Accepted(i64),
    /// Refused: the token was below `max_seen`.
    Rejected {
        /// The highest token the register had seen.
        max_seen: u64,
    },
    /// No answer within the bound, or a failed connection: it may have
    /// been applied or not.
    Unknown(String),
}

/// A worker's connection to the register.
#[derive(Clone)]
pub struct FencedRegister {
    connection: MultiplexedConnection,
    timeout: Duration,
}

impl FencedRegister {
    /// Connects to the register's server; each operation is then bounded by
    /// `timeout`.
    ///
    /// # Errors
    ///
    /// Fails when the server cannot be reached within `timeout`.
    pub async fn connect(url: &str, timeout: Duration) -> Result<FencedRegister, TestkitError> {
        let fail =
            |e| TestkitError::with_source(format!("could not reach the register at {url}"), e);
        let client = redis::Client::open(url).map_err(fail)?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let connection = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(fail)?;
        Ok(FencedRegister {
            connection,
            timeout,
        })
    }

    /// Reads the counter, with `token` when fenced.
    pub async fn read(&mut self, token: Option<u64>, tag: &str) -> Answer {
        self.operate(OpKind::Read, token, 0, tag).await
    }

    /// Writes `value`, with `token` when fenced.
    pub async fn write(&mut self, token: Option<u64>, value: i64, tag: &str) -> Answer {
        self.operate(OpKind::Write, token, value, tag).await
    }

    async fn operate(&mut self, op: OpKind, token: Option<u64>, value: i64, tag: &str) -> Answer {
        let mut invocation = OPERATION.prepare_invoke();
        invocation
            .key(REGISTER_KEY)
            .key(LOG_KEY)
            .arg(op_name(op))
            .arg(token.map(|t| t.to_string()).unwrap_or_default())
            .arg(value)
            .arg(tag);
        let answer = tokio::time::timeout(
            self.timeout,
            invocation.invoke_async::<(i64, String)>(&mut self.connection),
        )
        .await;
        match answer {
            Ok(Ok((1, value))) => match value.parse() {
                Ok(value) => Answer::Accepted(value),
                Err(_) => Answer::Unknown(format!("the register holds {value:?}")),
            },
            Ok(Ok((_, seen))) => Answer::Rejected {
                max_seen: seen.parse().unwrap_or(0),
            },
            Ok(Err(e)) => Answer::Unknown(e.to_string()),
            Err(_) => Answer::Unknown(format!("no answer within {:?}", self.timeout)),
        }
    }
}

fn op_name(op: OpKind) -> &'static str {
    match op {
        OpKind::Read => "read",
        OpKind::Write => "write",
    }
}

/// One line of the register's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogEntry {
    /// Read or write.
    pub op: OpKind,
    /// Whether it was done (else refused for a stale token).
    pub accepted: bool,
    /// Its token; `None` when unfenced.
    pub token: Option<u64>,
    /// The value read or written; `None` when refused.
    pub value: Option<i64>,
    /// The tag the worker gave it.
    pub tag: String,
}

impl LogEntry {
    /// Reads one line of the log.
    pub fn parse(line: &str) -> Option<LogEntry> {
        let mut fields = line.split(' ');
        let op = match fields.next()? {
            "read" => OpKind::Read,
            "write" => OpKind::Write,
            _ => return None,
        };
        let accepted = match fields.next()? {
            "accepted" => true,
            "rejected" => false,
            _ => return None,
        };
        let token = match fields.next()? {
            "-" => None,
            token => Some(token.parse().ok()?),
        };
        let value = match fields.next()? {
            "-" => None,
            value => Some(value.parse().ok()?),
        };
        let tag = fields.next()?.to_owned();
        fields.next().is_none().then_some(LogEntry {
            op,
            accepted,
            token,
            value,
            tag,
        })
    }
}

/// The register as it ended a run: the counter, the highest token seen and
/// the log of every operation it answered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegisterState {
    /// The counter.
    pub value: i64,
    /// The highest token seen, if any fenced operation was accepted.
    pub max_seen: Option<u64>,
    /// Every operation, in the order the register answered them.
    pub log: Vec<LogEntry>,
}

impl RegisterState {
    /// Reads the register's state from its server.
    ///
    /// # Errors
    ///
    /// Fails when the server cannot be asked, or holds something the
    /// register would not have written.
    pub fn read(server: &RedisServer) -> Result<RegisterState, TestkitError> {
        let value: Option<i64> = server.try_cmd(&["HGET", REGISTER_KEY, "value"])?;
        let max_seen: Option<u64> = server.try_cmd(&["HGET", REGISTER_KEY, "max_seen"])?;
        let lines: Vec<String> = server.try_cmd(&["LRANGE", LOG_KEY, "0", "-1"])?;
        let log = lines
            .iter()
            .map(|line| {
                LogEntry::parse(line)
                    .ok_or_else(|| TestkitError::new(format!("a bad register log line: {line:?}")))
            })
            .collect::<Result<_, _>>()?;
        Ok(RegisterState {
            value: value.unwrap_or(0),
            max_seen,
            log,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_parse() {
        assert_eq!(
            LogEntry::parse("write accepted 17 5 w1.3"),
            Some(LogEntry {
                op: OpKind::Write,
                accepted: true,
                token: Some(17),
                value: Some(5),
                tag: "w1.3".to_owned(),
            })
        );
        assert_eq!(
            LogEntry::parse("read rejected 16 - w2.9").map(|e| (e.accepted, e.value)),
            Some((false, None))
        );
        assert_eq!(
            LogEntry::parse("read accepted - 0 w3.1").map(|e| e.token),
            Some(None)
        );
        assert_eq!(LogEntry::parse("read accepted - 0"), None);
        assert_eq!(LogEntry::parse("write accepted 1 2 t extra"), None);
    }
}
