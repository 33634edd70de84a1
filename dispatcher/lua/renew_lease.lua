-- Extend a partition's lease, only if we still hold it.
-- KEYS[1] the lease key; ARGV[1] our token, ARGV[2] the lease period (ms)
-- Returns 1 when renewed, 0 when the lease is someone else's or gone.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
