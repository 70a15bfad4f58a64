local refused = not_ours(KEYS[1], ARGV[1])
if refused then
  return refused
end
local answer = 1
if KEYS[2] then
  answer = next_fence(KEYS[2], ARGV[3])
  if type(answer) == "table" then
    if string.sub(answer.err, 1, 9) == "WRONGTYPE" then
      return 0
    end
    return answer
  end
end
if KEYS[2] then
  local value = redis.call("GET", KEYS[1])
  redis.call("SET", KEYS[1], with_fence(value, answer), "PX", ARGV[2])
else
  redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
return answer