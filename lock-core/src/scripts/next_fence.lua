return next_fence(KEYS[1], ARGV[1])
