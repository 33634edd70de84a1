-- Shared by index_add.lua, index_remove.lua and rebuild_index.lua (prepended to each): the
-- listing's secondary sorted sets (parley/client/inbox.py, schemas/keys.py), all of score 0, read by
-- ZRANGE BYLEX. The names come in ARGV from `first` on: by-time set, by-session set, the
-- "anyone may answer" set, the per-reason key prefix, the per-principal key prefix.
local function index_names(first)
  return {time = ARGV[first], session = ARGV[first + 1], anyone = ARGV[first + 2],
          reason = ARGV[first + 3], principal = ARGV[first + 4]}
end

-- The (set, member) pairs an open interrupt is listed under. Members start with the raise time
-- in 15 digits (byte order is time order), but in the session set, which starts with the session.
local function index_entries(names, info)
  local t = string.format('%015.0f', info.raised_at)
  local timed = t .. '\31' .. info.session .. '\31' .. info.interrupt_id
  local out = {{names.time, timed}, {names.reason .. info.reason, timed},
               {names.session, info.session .. '\31' .. t .. '\31' .. info.interrupt_id}}
  if type(info.resumable_by) == 'table' then
    for _, principal in ipairs(info.resumable_by) do
      out[#out + 1] = {names.principal .. principal, timed}
    end
  else  -- null: anyone may resume it (an empty list: nobody, so in no principal's set)
    out[#out + 1] = {names.anyone, timed}
  end
  return out
end

local function index_list(names, info)
  for _, entry in ipairs(index_entries(names, info)) do
    redis.call('ZADD', entry[1], 0, entry[2])
  end
end

local function index_unlist(names, info)
  for _, entry in ipairs(index_entries(names, info)) do
    redis.call('ZREM', entry[1], entry[2])  -- the last member out deletes the set
  end
end
