local refused = not_ours(KEYS[1], ARGV[1])
if refused then
  return refused
end
if redis.call("PEXPIRE", KEYS[1], ARGV[2], "GT") == 0 and redis.call("PTTL", KEYS[1]) == -1 then
  redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
return 1