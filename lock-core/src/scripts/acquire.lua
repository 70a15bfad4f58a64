local ok, held = read(KEYS[1])
if not ok and held then
  return held
end
if ok and not held then
  local fence, value = 0, ARGV[1]
  if KEYS[3] then
    fence = next_fence(KEYS[3], ARGV[4])
    if type(fence) == "table" then
      return fence
    end
    value = with_fence(value, fence)
  end
  redis.call("SET", KEYS[1], value, "PX", ARGV[2])
  if KEYS[2] then
    redis.call("DEL", KEYS[2])
  end
  return {1, fence}
end
if ok and held == "shared" and KEYS[2] then
  redis.call("SET", KEYS[2], "1", "PX", ARGV[3])
end
return {0, redis.call("PTTL", KEYS[1]), foreign(held)}