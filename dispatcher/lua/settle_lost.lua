-- Post the loss of a job whose worker died, exactly once, whichever dispatcher sees it first.
-- KEYS[1] the running-jobs hash, KEYS[2] the session's results stream, KEYS[3] the in-flight hash,
-- KEYS[4] the config hash
-- ARGV[1] RQ job id, ARGV[2] the record as read (compared: unchanged since), ARGV[3] outcome JSON,
-- ARGV[4] the session's partition
-- Returns 1 when posted, 0 when the record changed or is gone.
-- Returns -2 (skipped) when the config has a `shard` and its route:<partition> is another value.
-- A deployment of several shards: act only while this shard serves the session's partition
-- by the STORED table (route:<p> = the config's `shard`), not by the caller's copy of it: a
-- dispatcher that stalled across a move's freeze must not write behind the move's copy.
local route = redis.call('HMGET', KEYS[4], 'shard', 'route:' .. ARGV[4])
if route[1] and route[2] ~= route[1] then
  return -2
end
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return 0
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('XADD', KEYS[2], '*', 'outcome', ARGV[3])
return 1
