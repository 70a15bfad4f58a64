local renewed = {}
for i, key in ipairs(KEYS) do
  local ok, value = read(key)
  if not ok and value then
    return value
  end
  renewed[i] = 0
  if ok and owns(value, ARGV[2 * i - 1]) then
    local ttl = ARGV[2 * i]
    if redis.call("PEXPIRE", key, ttl, "GT") == 0 and redis.call("PTTL", key) == -1 then
      redis.call("PEXPIRE", key, ttl)
    end
    renewed[i] = 1
  end
end
return renewed