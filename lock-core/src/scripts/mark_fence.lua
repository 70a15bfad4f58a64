local refused = not_ours(KEYS[1], ARGV[1])
if refused then
  return refused
end
local value = redis.call("GET", KEYS[1])
local fenced = with_fence(value, ARGV[2])
if fenced ~= value then
  redis.call("SET", KEYS[1], fenced, "KEEPTTL")
end
return 1
