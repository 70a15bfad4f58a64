local now = redis.call("TIME")
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
if redis.call("TYPE", KEYS[1]).ok ~= "zset" then
  return {ms}
end
local live = redis.call("ZRANGE", KEYS[1], "(" .. ms, "+inf", "BYSCORE")
table.insert(live, 1, ms)
return live