-- requires: index_lib
-- An interrupt opened: into the index (and the deadlines), and counted. The counts move only
-- when the index really changes (the member was not there), so doing the same effect again
-- (a flush replayed after a crash) leaves them exact.
-- KEYS[1] the index (zset), KEYS[2] its details (hash), KEYS[3] the deadlines (zset),
-- KEYS[4] open interrupts per session and anchor (hash), KEYS[5] the stats hash
-- ARGV[1] index member, ARGV[2] raised at (ms), ARGV[3] details (JSON: session, anchor, ...),
-- ARGV[4] deadline (ms, '' = none), ARGV[5..9] the listing's set names (index_lib.lua)
local new = redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
if ARGV[4] ~= '' then
  redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
end
local info = cjson.decode(ARGV[3])
index_list(index_names(5), info)  -- idempotent: a replayed flush adds nothing twice
if new == 1 then
  local anchor = info.anchor
  if type(anchor) ~= 'string' then
    anchor = ''  -- a global interrupt parks every branch of its session: one per session
  end
  if redis.call('HINCRBY', KEYS[4], info.session .. '\31' .. anchor, 1) == 1 then
    redis.call('HINCRBY', KEYS[5], 'parked', 1)
  end
end
return new
