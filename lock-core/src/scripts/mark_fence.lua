local refused = not_ours(KEYS[1], ARGV[1])
if refused then
  return refused
end
fence_value(KEYS[1], ARGV[2])
return 1
