-- Give a partition's lease back, only if we still hold it.
-- KEYS[1] the lease key; ARGV[1] our token
-- Returns 1 when released, 0 otherwise.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
