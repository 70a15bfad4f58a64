local refused = not_ours(KEYS[1], ARGV[1])
if refused then
  return refused
end
local counted, counter = read(KEYS[2])
if not counted then
  return counter or 0
end
local current = tonumber(counter or "0")
if current == nil then
  return 0
end
if current < tonumber(ARGV[2]) then
  redis.call("SET", KEYS[2], ARGV[2], "PX", ARGV[3])
else
  redis.call("PEXPIRE", KEYS[2], ARGV[3])
end
fence_value(KEYS[1], ARGV[2])
return 1