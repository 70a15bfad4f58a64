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
