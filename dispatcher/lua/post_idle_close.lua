-- The idle sweep's close of one session, written once: only while the session is still due
-- in the idle set at the score the sweep read (a transition since moved or removed it).
-- KEYS[1] the idle sorted set
-- KEYS[2] the session's input stream
-- KEYS[3] the config hash
-- ARGV[1] the session id
-- ARGV[2] the score the sweep read (Unix ms)
-- ARGV[3] the session's partition
-- ARGV[4 ..] the input entry's fields and values (signed by the engine's key)
-- Returns 1 posted, 0 not due at that score.
-- Returns -2 (skipped) when the config has a `shard` and its route:<partition> is another value.
-- A deployment of several shards: act only while this shard serves the session's partition
-- by the STORED table (route:<p> = the config's `shard`), not by the caller's copy of it: a
-- dispatcher that stalled across a move's freeze must not write behind the move's copy.
local route = redis.call('HMGET', KEYS[3], 'shard', 'route:' .. ARGV[3])
if route[1] and route[2] ~= route[1] then
  return -2
end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('XADD', KEYS[2], '*', unpack(ARGV, 4))
return 1
