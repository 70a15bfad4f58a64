local ok, held = read(KEYS[1])
if not ok and held then
  return held
end
if held or not ok then
  return 0
end
local fence = next_fence(KEYS[2], ARGV[3])
if type(fence) == "table" then
  return fence
end
redis.call("SET", KEYS[1], with_fence(ARGV[1], fence), "PX", ARGV[2])
return fence