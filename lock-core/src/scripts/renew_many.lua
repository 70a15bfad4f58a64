local renewed = {}
for i, key in ipairs(KEYS) do
  local ok, value = read(key)
  if not ok and value then
    return value
  end
  renewed[i] = 0
  if ok and owns(value, ARGV[2 * i - 1]) then
    local ttl = tonumber(ARGV[2 * i])
    if redis.call("PTTL", key) < ttl then
      redis.call("PEXPIRE", key, ttl)
    end
    renewed[i] = 1
  end
end
return renewed