if redis.call("TYPE", KEYS[1]).ok ~= "string" then
  return {false, false}
end
local value = redis.call("GET", KEYS[1])
local record = false
if redis.call("TYPE", KEYS[2]).ok == "string" then
  record = redis.call("GET", KEYS[2])
end
return {value, record}