local ok, held = read(KEYS[1])
if not ok then
  return held or {0, redis.call("PTTL", KEYS[1])}
end
local marker = ARGV[3]
if held and held ~= marker then
  if is_marker(held) then
    return {-1, held}
  end
  return {0, redis.call("PTTL", KEYS[1])}
end
local limit = tonumber(ARGV[4])
if limit == 0 then
  local writer = redis.call("PTTL", KEYS[3])
  if writer > 0 then
    return {0, writer}
  end
end
local now = clock_ms()
redis.call("ZREMRANGEBYSCORE", KEYS[2], "-inf", now)
if limit > 0 and redis.call("ZCARD", KEYS[2]) >= limit then
  local first = redis.call("ZRANGE", KEYS[2], 0, 0, "WITHSCORES")
  return {0, math.max(1, tonumber(first[2]) - now)}
end
redis.call("ZADD", KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
stretch(KEYS[1], KEYS[2], marker, now)
return {1, 0}