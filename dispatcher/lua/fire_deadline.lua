-- Hand a due interrupt deadline to its session's results stream, exactly once, whichever
-- dispatcher sees it first.
-- KEYS[1] the deadlines sorted set (member: session \x1f interrupt id, score: deadline ms)
-- KEYS[2] the session's results stream, KEYS[3] the config hash
-- ARGV[1] the member, ARGV[2] now (Unix ms), ARGV[3] the 'deadline' work outcome JSON,
-- ARGV[4] the session's partition, ARGV[5] the engine's signature of ARGV[3] (workers write
-- results streams too: an outcome only the engine makes is applied only with it)
-- Returns 1 when posted, 0 when not due or already taken.
-- Returns -2 (skipped) when the config has a `shard` and its route:<partition> is another value.
-- A deployment of several shards: act only while this shard serves the session's partition
-- by the STORED table (route:<p> = the config's `shard`), not by the caller's copy of it: a
-- dispatcher that stalled across a move's freeze must not write behind the move's copy.
local route = redis.call('HMGET', KEYS[3], 'shard', 'route:' .. ARGV[4])
if route[1] and route[2] ~= route[1] then
  return -2
end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) > tonumber(ARGV[2]) then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('XADD', KEYS[2], '*', 'outcome', ARGV[3], 'engine_sig', ARGV[5])
return 1
