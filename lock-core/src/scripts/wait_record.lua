local now = redis.call("TIME")
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", ms)
redis.call("ZADD", KEYS[1], ms + ttl, ARGV[1])
if redis.call("PTTL", KEYS[1]) < ttl then
  redis.call("PEXPIRE", KEYS[1], ttl)
end
return 1