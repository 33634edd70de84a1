-- Count the open interrupts per session and anchor once, for an index written before the counts
-- were kept (index_add.lua keeps them from then on). Atomic with the flushes, and done only when
-- the stats hash has no 'parked' field, i.e. once per Redis.
-- KEYS[1] the index details (hash), KEYS[2] open interrupts per session and anchor (hash),
-- KEYS[3] the stats hash
-- Returns the number of parked anchors counted, or -1 when the counts were there.
if redis.call('HEXISTS', KEYS[3], 'parked') == 1 then
  return -1
end
redis.call('DEL', KEYS[2])
local parked = 0
for _, details in ipairs(redis.call('HVALS', KEYS[1])) do
  local info = cjson.decode(details)
  local anchor = info.anchor
  if type(anchor) ~= 'string' then
    anchor = ''
  end
  if redis.call('HINCRBY', KEYS[2], info.session .. '\31' .. anchor, 1) == 1 then
    parked = parked + 1
  end
end
redis.call('HSET', KEYS[3], 'parked', parked)
return parked
