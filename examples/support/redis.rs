//! Where the examples find Redis: `REDIS_URL`, or a throwaway `redis-server`
//! started from PATH on a free port for the length of the example.

use lock_testkit::RedisServer;

/// The Redis the example uses; a started server lives as long as this value.
pub enum ExampleRedis {
    /// `REDIS_URL` from the environment.
    External(String),
    /// A throwaway server, stopped when dropped.
    Throwaway(RedisServer),
}

impl ExampleRedis {
    pub fn url(&self) -> String {
        match self {
            ExampleRedis::External(url) => url.clone(),
            ExampleRedis::Throwaway(server) => server.url(),
        }
    }
}

pub fn redis_url() -> Result<ExampleRedis, String> {
    if let Ok(url) = std::env::var("REDIS_URL") {
        println!("using REDIS_URL={url}");
        return Ok(ExampleRedis::External(url));
    }
    if lock_testkit::redis_server_binary().is_err() {
        return Err(
            "no Redis: set REDIS_URL=redis://host:6379, or install redis-server \
                    (Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis)"
                .to_owned(),
        );
    }
    let server = RedisServer::try_start().map_err(|e| format!("cannot start redis-server: {e}"))?;
    println!(
        "REDIS_URL not set; started a throwaway redis-server at {}",
        server.url()
    );
    Ok(ExampleRedis::Throwaway(server))
}

/// Where the quickstart keeps its locks: Redis when there is one, otherwise
/// this process's memory (so the example runs on any machine with Rust).
#[allow(dead_code)] // not every example falls back
pub enum Backing {
    /// A Redis server, from `REDIS_URL` or started for the example.
    Redis(Box<ExampleRedis>),
    /// No Redis to be had: the in-memory store.
    Memory(lock_core::MemoryStore),
}

#[allow(dead_code)]
impl Backing {
    /// A client builder pointed at the backing.
    pub fn builder(&self) -> lock_core::LockClientBuilder {
        match self {
            Backing::Redis(redis) => lock_core::LockClient::builder().url(redis.url()),
            Backing::Memory(store) => lock_core::LockClient::builder().in_memory(store),
        }
    }
}

/// Redis as [`redis_url`] finds it, or, when there is neither `REDIS_URL`
/// nor a `redis-server` binary, the in-memory store, saying so plainly.
#[allow(dead_code)]
pub fn redis_or_memory() -> Result<Backing, String> {
    if std::env::var_os("REDIS_URL").is_none() && lock_testkit::redis_server_binary().is_err() {
        println!(
            "no REDIS_URL and no redis-server on PATH: running on the in-memory backend \
             (locks shared inside this process only). Install redis-server or set \
             REDIS_URL=redis://host:6379 to lock across processes."
        );
        return Ok(Backing::Memory(lock_core::MemoryStore::new()));
    }
    redis_url().map(|redis| Backing::Redis(Box::new(redis)))
}
