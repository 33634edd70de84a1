-- A placement written on one shard by compare-and-set: only if the table stored there is still
-- the version the mover read, so two movers (or a move and a repair) never overwrite each
-- other's change; the last write would otherwise win on each shard.
-- KEYS[1] the config hash
-- ARGV[1] the stored `placement` version expected ('' = none stored yet)
-- ARGV[2 ..] the fields and values to write (Placement.config_fields)
-- Returns 1 written, else the version found (0 when none is stored): nothing written.
local raw = redis.call('HGET', KEYS[1], 'placement')
local found = 0
if raw then
  found = tonumber(cjson.decode(raw)['version']) or 0
end
local expected = tonumber(ARGV[1]) or 0
if found ~= expected or (raw and ARGV[1] == '') then
  return {0, found}
end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
return {1, found}
