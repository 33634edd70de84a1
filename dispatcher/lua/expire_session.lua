-- Delete every key of a closed session whose retention has ended, and every entry naming it.
-- KEYS[1] meta hash ({S}: ver)
-- KEYS[2] the expiring sorted set
-- KEYS[3] the idle sorted set
-- KEYS[4] the config hash
-- KEYS[5 .. 4+n] the session's own keys (Keys.session_keys, meta included)
-- KEYS[5+n ..] the listing's sorted sets the session is in (schemas/listing.py), one per member,
--         and last its partition's list of sessions (Keys.partition_sessions)
-- ARGV[1] the session id
-- ARGV[2] the version the sweep read (and found the session closed at)
-- ARGV[3] n: how many of KEYS are the session's own
-- ARGV[4] the session's partition
-- ARGV[5 ..] the listing members, in the order of their sets
-- Returns 1 deleted, 0 the session moved on since it was read (read again, retried: nothing
-- of it is deleted), -1 no longer expiring (another dispatcher was first: nothing to do).
-- Returns -2 (skipped) when the config has a `shard` and its route:<partition> is another value.
-- A deployment of several shards: act only while this shard serves the session's partition
-- by the STORED table (route:<p> = the config's `shard`), not by the caller's copy of it: a
-- dispatcher that stalled across a move's freeze must not write behind the move's copy.
local route = redis.call('HMGET', KEYS[4], 'shard', 'route:' .. ARGV[4])
if route[1] and route[2] ~= route[1] then
  return -2
end
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return -1
end
local ver = redis.call('HGET', KEYS[1], 'ver') or '0'
if ver ~= ARGV[2] then
  return 0
end
local n = tonumber(ARGV[3])
for j = 5, 4 + n do
  redis.call('DEL', KEYS[j])
end
for j = 5 + n, #KEYS do
  redis.call('ZREM', KEYS[j], ARGV[j - n])
end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
