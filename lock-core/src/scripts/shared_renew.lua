local now = clock_ms()
local exact = ARGV[1] == "1"
local renewed = {}
for i = 1, #KEYS / 2 do
  local lock, holders = KEYS[2 * i - 1], KEYS[2 * i]
  local marker, token = ARGV[3 * i - 1], ARGV[3 * i]
  local expiry = now + tonumber(ARGV[3 * i + 1])
  renewed[i] = 0
  local ok, held = read(lock)
  if ok and held == marker then
    local score = redis.call("ZSCORE", holders, token)
    if score and tonumber(score) > now then
      if exact or expiry > tonumber(score) then
        redis.call("ZADD", holders, expiry, token)
      end
      renewed[i] = 1
    else
      redis.call("ZREM", holders, token)
    end
    redis.call("ZREMRANGEBYSCORE", holders, "-inf", now)
    stretch(lock, holders, marker, now)
  end
end
return renewed