local allowed = 0
local ok, may = pcall(redis.acl_check_cmd, "DELIFEQ", KEYS[1], ARGV[2])
if ok and may then
  allowed = 1
end
local refused = not_ours(KEYS[1], ARGV[1])
if refused then
  if type(refused) == "table" then
    return refused
  end
  return {refused, allowed * 2}
end
if redis.call("GET", KEYS[1]) ~= ARGV[2] then
  allowed = 0
end
redis.call("DEL", KEYS[1])
if ARGV[3] ~= "quiet" then
  redis.call("PUBLISH", KEYS[1], "")
end
return {1, allowed}
