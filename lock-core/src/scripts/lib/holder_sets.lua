local function clock_ms()
  local now = redis.call("TIME")
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end
local function stretch(lock, holders, marker, now)
  local last = redis.call("ZRANGE", holders, -1, -1, "WITHSCORES")
  if last[2] == nil then
    redis.call("DEL", lock, holders)
    return
  end
  local left = math.max(1, tonumber(last[2]) - now)
  redis.call("SET", lock, marker, "PX", left)
  redis.call("PEXPIRE", holders, left)
end
local function is_marker(value)
  return value == "shared" or string.sub(value, 1, 8) == "permits:"
end
