-- Post the loss of a job that left its queue but was never recorded as running (its worker
-- died between RQ's dequeue and the job's first line), exactly once.
-- KEYS[1] the in-flight hash, KEYS[2] the running hash, KEYS[3] the session's results stream,
-- KEYS[4] the RQ job hash (deleted, so RQ's own cleanup can never run the job after all),
-- KEYS[5] the queue's in-flight order, KEYS[6] the config hash, KEYS[7] the job's token key
-- (deleted: a take that never happened leaves it, and no take will read it now)
-- ARGV[1] RQ job id, ARGV[2] the in-flight record as read, ARGV[3] the 'lost' outcome JSON,
-- ARGV[4] the session's partition
-- Returns 1 when posted, 0 when the job was answered, claimed or changed meanwhile.
-- Returns -2 (skipped) when the config has a `shard` and its route:<partition> is another value.
-- A deployment of several shards: act only while this shard serves the session's partition
-- by the STORED table (route:<p> = the config's `shard`), not by the caller's copy of it: a
-- dispatcher that stalled across a move's freeze must not write behind the move's copy.
local route = redis.call('HMGET', KEYS[6], 'shard', 'route:' .. ARGV[4])
if route[1] and route[2] ~= route[1] then
  return -2
end
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] or redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then
  return 0
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('DEL', KEYS[4])
redis.call('DEL', KEYS[7])
redis.call('XADD', KEYS[3], '*', 'outcome', ARGV[3])
return 1
