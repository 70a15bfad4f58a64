local now = clock_ms()
local ok, value = read(KEYS[1])
if not ok and value then
  return value
end
if not ok then
  return {"foreign", redis.call("PTTL", KEYS[1]), now, redis.call("TYPE", KEYS[1]).ok, 0}
end
if not value then
  return {"free", -2, now, "", 0}
end
local count = 1
if is_marker(value) then
  count = redis.call("ZCOUNT", KEYS[2], "(" .. now, "+inf")
end
return {"held", redis.call("PTTL", KEYS[1]), now, value, count}