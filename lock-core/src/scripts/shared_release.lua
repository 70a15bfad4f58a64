local ok, held = read(KEYS[1])
if not ok or held ~= ARGV[2] then
  return 0
end
local now = clock_ms()
local score = redis.call("ZSCORE", KEYS[2], ARGV[1])
local ours = 0
if score and tonumber(score) > now then
  ours = 1
end
redis.call("ZREM", KEYS[2], ARGV[1])
redis.call("ZREMRANGEBYSCORE", KEYS[2], "-inf", now)
stretch(KEYS[1], KEYS[2], ARGV[2], now)
if not KEYS[3] or redis.call("EXISTS", KEYS[3]) == 1 then
  redis.call("PUBLISH", KEYS[1], "")
end
return ours