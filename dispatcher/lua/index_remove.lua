-- requires: index_lib
-- An interrupt resumed: out of the index and the deadlines, and uncounted; only when it was
-- there, so a flush replayed after a crash counts nothing twice (see index_add.lua).
-- KEYS[1] the index (zset), KEYS[2] its details (hash), KEYS[3] the deadlines (zset),
-- KEYS[4] open interrupts per session and anchor (hash), KEYS[5] the stats hash
-- ARGV[1] index member, ARGV[2..6] the listing's set names (index_lib.lua)
local details = redis.call('HGET', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if not details then
  return 0
end
redis.call('HDEL', KEYS[2], ARGV[1])
local info = cjson.decode(details)
index_unlist(index_names(2), info)
local anchor = info.anchor
if type(anchor) ~= 'string' then
  anchor = ''
end
local field = info.session .. '\31' .. anchor
if redis.call('HINCRBY', KEYS[4], field, -1) <= 0 then
  redis.call('HDEL', KEYS[4], field)
  redis.call('HINCRBY', KEYS[5], 'parked', -1)
end
return 1
