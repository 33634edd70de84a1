-- requires: index_lib
-- Build the listing's secondary sets once, for an index an older dispatcher wrote without them
-- (index_add.lua keeps them from then on). Atomic with the flushes; done only when the stats
-- hash has no 'listing' field, i.e. once per Redis. Details written by an older dispatcher lack what the
-- listing shows (request, expires_at, default, resumable_by, metadata): they are completed from
-- the session's own record, which has them.
-- KEYS[1] the index details (hash), KEYS[2] the stats hash
-- ARGV[1..5] the listing's set names (index_lib.lua), ARGV[6] and ARGV[7] what goes before and
-- after a session id in its meta key
-- Returns the number of interrupts listed, or -1 when the sets were there.
if redis.call('HEXISTS', KEYS[2], 'listing') == 1 then
  return -1
end
pcall(cjson.encode_number_precision, 16)  -- rewritten details keep integers like raise times whole
local names = index_names(1)
local listed = 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local info = cjson.decode(all[i + 1])
  if info.request == nil and type(info.session) == 'string' then
    local core = redis.call('HGET', ARGV[6] .. info.session .. ARGV[7], 'core')
    local state = core and cjson.decode(core)
    -- a session with no open interrupt stores none (its details may still be here: an
    -- IndexRemove waiting in an outbox): such a row is listed as it is
    local open = type(state) == 'table' and state.interrupts
    local rec = type(open) == 'table' and open[info.interrupt_id]
    if type(rec) == 'table' then
      info.request = rec.payload
      info.expires_at = rec.deadline
      info.default = rec.default
      info.resumable_by = rec.resumable_by
      info.metadata = state.metadata
      redis.call('HSET', KEYS[1], all[i], cjson.encode(info))
    end
  end
  index_list(names, info)
  listed = listed + 1
end
redis.call('HSET', KEYS[2], 'listing', 1)
return listed
