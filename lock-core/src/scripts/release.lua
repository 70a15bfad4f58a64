local refused = not_ours(KEYS[1], ARGV[1])
if refused then
  return refused
end
redis.call("DEL", KEYS[1])
if ARGV[2] ~= "quiet" and (not KEYS[2] or redis.call("EXISTS", KEYS[2]) == 1) then
  redis.call("PUBLISH", KEYS[1], "")
end
return 1