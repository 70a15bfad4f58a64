local refused = not_ours(KEYS[1], ARGV[1])
if refused then
  return refused
end
redis.call("PEXPIRE", KEYS[1], ARGV[2], "GT")
return 1