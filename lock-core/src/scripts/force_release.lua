local ok, value = read(KEYS[1])
if not ok and value then
  return value
end
if not ok then
  return {-1, redis.call("TYPE", KEYS[1]).ok, 0, -2}
end
if not value then
  return {0, "", 0, -2}
end
local pttl = redis.call("PTTL", KEYS[1])
local left = pttl
local evicted = string.match(value, "^[^|]*")
local count = 1
if is_marker(value) then
  count = redis.call("ZCOUNT", KEYS[2], "(" .. clock_ms(), "+inf")
  evicted = table.concat(redis.call("ZRANGE", KEYS[2], 0, -1), " ")
  redis.call("DEL", KEYS[2])
end
redis.call("DEL", KEYS[1])
if pttl > 0 and evicted ~= "" then
  local known, old = read(KEYS[3])
  if known and old then
    evicted = old .. " " .. evicted
    pttl = math.max(pttl, redis.call("PTTL", KEYS[3]))
  end
  redis.call("SET", KEYS[3], evicted, "PX", pttl)
end
if not KEYS[4] or redis.call("EXISTS", KEYS[4]) == 1 then
  redis.call("PUBLISH", KEYS[1], "")
end
return {1, value, count, left}