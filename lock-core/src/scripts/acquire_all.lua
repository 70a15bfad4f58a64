local n = tonumber(ARGV[3])
for i = 1, n do
  local ok, held = read(KEYS[i])
  if not ok and held then
    return held
  end
  if held or not ok then
    if held == "shared" and ARGV[4] ~= "0" then
      redis.call("SET", KEYS[n + i], "1", "PX", ARGV[4])
    end
    return {0, i, redis.call("PTTL", KEYS[i])}
  end
end
local answer = {1}
for i = 1, n do
  answer[i + 1] = 0
  if KEYS[2 * n + 1] then
    local fence = next_fence(KEYS[2 * n + i], ARGV[5])
    if type(fence) == "table" then
      return fence
    end
    answer[i + 1] = fence
  end
end
for i = 1, n do
  local value = ARGV[1]
  if KEYS[2 * n + 1] then
    value = with_fence(value, answer[i + 1])
  end
  redis.call("SET", KEYS[i], value, "PX", ARGV[2])
  if ARGV[4] ~= "0" then
    redis.call("DEL", KEYS[n + i])
  end
end
return answer