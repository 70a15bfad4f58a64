if redis.call("TYPE", KEYS[1]).ok ~= "string" then
  return {false, {}}
end
local value = redis.call("GET", KEYS[1])
local notes = {}
if redis.call("TYPE", KEYS[2]).ok == "zset" then
  local now = redis.call("TIME")
  local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  notes = redis.call("ZRANGE", KEYS[2], "(" .. ms, "+inf", "BYSCORE")
end
return {value, notes}
