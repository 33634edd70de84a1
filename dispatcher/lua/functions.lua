#!lua name=parley
-- The Redis Function library `parley`: the producers' submit path (docs/protocol.md, "Writing
-- inputs"). Dispatchers load it at start and whenever it is missing or older than VERSION
-- (dispatcher/functions.py reads VERSION from this text: keep the line's shape).
--
-- Why a function: Redis ACLs can limit a login's commands and keys, not a command's arguments,
-- so a producer allowed XADD can also trim (MAXLEN) and choose ids. A producer login gets FCALL
-- and writes only its own streams; this function appends with `*`, no trimming, after the
-- admission checks. Every command it runs is ACL-checked against the CALLING login, so it
-- gives a producer nothing its login lacks; a producer that bypasses it (plain XADD to its own
-- stream) skips only the synchronous refusals, which dispatchers apply again.
local VERSION = 4

-- Defaults of the limits, used while `<prefix>:config` has none (dispatchers write theirs there).
local DEFAULTS = {limit_input_bytes = 1048576, limit_pending = 100, limit_messages = 10000,
                  limit_branches = 1000}
-- An entry's fields together (names and values, but `admitted`) may exceed the input limit by
-- this much, for the rest of the envelope (`session`, `id`, `principal`, `ts`, `sig`): the same
-- rule as the dispatcher's (schemas/codec.py ENVELOPE_BYTES; docs/protocol.md, "Limits").
local ENVELOPE_BYTES = 4096
local PRODUCER_MAX = 32
local SESSION_MAX, CHILD_MAX, TENANT_MAX = 128, 256, 64

local function refuse(code, message)
  return redis.error_reply('PARLEY ' .. code .. ' ' .. message)
end

-- schemas/ids.py is_session_id: [A-Za-z0-9._:/-], 1-128 characters (256 for the engine's
-- sub-agent ids `<parent>:sub-<n>`), and a tenant before the first `/` of [A-Za-z0-9._-]{1,64}.
local function valid_session(s)
  local n = #s
  if n < 1 or n > CHILD_MAX or not string.find(s, '^[A-Za-z0-9._:/%-]+$') then return false end
  if n > SESSION_MAX and not string.find(s, ':sub%-%d+$') then return false end
  local slash = string.find(s, '/', 1, true)
  if slash then
    local tenant = string.sub(s, 1, slash - 1)
    if #tenant < 1 or #tenant > TENANT_MAX or not string.find(tenant, '^[A-Za-z0-9._%-]+$') then
      return false
    end
  end
  return true
end

-- keys[1] must be the producer's own input stream (`<prefix>:in:<producer>` or its partition
-- `...:<n>`), keys[2] its own pending hash: the ACL lets a login name only its own anyway; this
-- says so clearly where there is no ACL, and keeps `producer` the name the keys belong to.
local function own_keys(keys, prefix, producer)
  local stream = prefix .. ':in:' .. producer
  local key = keys[1]
  local partitioned = string.sub(key, 1, #stream + 1) == stream .. ':'
      and string.find(string.sub(key, #stream + 2), '^%d+$') ~= nil
  return (key == stream or partitioned) and keys[2] == prefix .. ':pending:' .. producer
end

-- A deployment of several shards (schemas/shards.py): `<prefix>:config` holds this shard's
-- index (`shard`) and a route per partition (`route:<p>`: a shard's index, or `moving:<to>`
-- while the partition moves). An input for a partition this shard does not serve now is
-- refused `moved` (retryable: the caller reads the placement again). p is the stream's
-- partition suffix (0 for an unpartitioned stream). Without `shard` (one Redis): nil. Its
-- second value is the published partition count (nil before a dispatcher published one), read
-- in the same HMGET for `wrong_partition`.
local function moved(prefix, suffix)
  local p = suffix or '0'
  local got = redis.call('HMGET', prefix .. ':config', 'shard', 'route:' .. p, 'partitions')
  local shard, route, n = got[1], got[2], tonumber(got[3])
  if not shard or route == shard then return nil, n end
  if route and string.sub(route, 1, 7) == 'moving:' then
    return refuse('moved', 'partition ' .. p .. ' is moving to shard ' .. string.sub(route, 8)), n
  end
  return refuse('moved', 'partition ' .. p .. ' is on shard ' .. tostring(route or '?')), n
end

-- crc32 (IEEE, as Python's zlib.crc32), for the session's partition: crc32(root id) mod N.
-- Its table is made at the first call (a library's load may not use `bit`).
local CRC_TABLE = nil

local function crc_table()
  local t = {}
  for i = 0, 255 do
    local c = i
    for _ = 1, 8 do
      if bit.band(c, 1) == 1 then c = bit.bxor(bit.rshift(c, 1), 0xEDB88320) else c = bit.rshift(c, 1) end
    end
    t[i] = c
  end
  return t
end

local function crc32(s)
  CRC_TABLE = CRC_TABLE or crc_table()
  local crc = 0xFFFFFFFF
  for i = 1, #s do
    crc = bit.bxor(bit.rshift(crc, 8), CRC_TABLE[bit.band(bit.bxor(crc, string.byte(s, i)), 0xFF)])
  end
  crc = bit.bnot(crc)
  if crc < 0 then crc = crc + 4294967296 end  -- BitOp's results are signed 32-bit
  return crc
end

-- A sub-agent `<parent>:sub-<n>` (nested) is in its root's partition (schemas/ids.py).
local function root_session(session)
  local root = session
  while true do
    local cut = string.gsub(root, ':sub%-%d+$', '')
    if cut == root then return root end
    root = cut
  end
end

-- The stream must be the session's partition's under the count published now: a producer still
-- using the count from before `parley partitions resize` is refused `moved` (retryable: the
-- client reads the count and the placement again) instead of writing where the session's
-- partition is not (one dispatcher per session: docs/design.md).
local function wrong_partition(n, suffix, session)
  if not n then return nil end  -- no count published yet (no dispatcher has started): nothing to check
  local want = crc32(root_session(session)) % n
  if n <= 1 and suffix == nil then return nil end
  if n > 1 and suffix == string.format('%d', want) then return nil end
  return refuse('moved', 'session ' .. session .. ' is in partition ' .. want .. ' of ' .. n
                .. ': read the partition count again')
end

local function limits(prefix)
  local names = {'limit_input_bytes', 'limit_pending', 'limit_messages', 'limit_branches'}
  local got = redis.call('HMGET', prefix .. ':config', unpack(names))
  local out = {}
  for i, name in ipairs(names) do
    out[name] = tonumber(got[i]) or DEFAULTS[name]
  end
  return out
end

-- FCALL parley_submit 2 <stream> <pending> <prefix> <producer> <field> <value> [<field> <value> ...]
-- keys[1] the producer's input stream (its partition's): `<prefix>:in:<producer>[:<n>]`
-- keys[2] the producer's pending hash: `<prefix>:pending:<producer>` (session -> admitted, not
--         yet applied; dispatchers decrement it as they acknowledge an entry marked `admitted`)
-- args[1] the key prefix; args[2] the producer's name
-- args[3..] the entry's fields and values as XADD takes them: `session` and `input` required;
--         `id`, `principal`, `ts`, `sig` as docs/protocol.md says; `admitted` is the function's.
-- Reads, besides its keys: `<prefix>:config` (the limits, this shard's routes) and `<prefix>:{S}:meta` (the
-- session's counts `n_msgs`, `n_branches`): the login must be allowed to read them.
-- Returns the new entry's id; or an error `PARLEY <code> <message>` and writes nothing.
local function submit(keys, args)
  if #keys ~= 2 or #args < 6 or #args % 2 ~= 0 then
    return refuse('invalid_input', 'call it as FCALL parley_submit 2 <stream> <pending> <prefix> '
                  .. '<producer> <field> <value> ...')
  end
  local prefix, producer = args[1], args[2]
  if #producer > PRODUCER_MAX or not string.find(producer, '^[a-z0-9][a-z0-9_%-]*$') then
    return refuse('invalid_input', 'invalid producer name')
  end
  if not own_keys(keys, prefix, producer) then
    return refuse('invalid_input', 'the keys must be producer ' .. producer .. "'s own input stream "
                  .. 'and pending hash')
  end
  -- the stream's partition suffix, after the producer's own stream name (a producer's name may
  -- be all digits: `<prefix>:in:42` has no suffix); nil for the unpartitioned stream
  local base = prefix .. ':in:' .. producer
  local suffix = nil
  if #keys[1] > #base then suffix = string.sub(keys[1], #base + 2) end
  local elsewhere, partitions = moved(prefix, suffix)
  if elsewhere then return elsewhere end
  local lim = limits(prefix)
  local size, session, input = 0, nil, nil
  for i = 3, #args, 2 do
    local name, value = args[i], args[i + 1]
    size = size + #name + #value
    if name == 'session' then session = value
    elseif name == 'input' then input = value
    elseif name == 'admitted' then
      return refuse('invalid_input', 'the field `admitted` is set by the submit function')
    end
  end
  if input ~= nil and #input > lim.limit_input_bytes then
    return refuse('too_large', '`input` is ' .. #input .. ' bytes, over the limit of '
                  .. lim.limit_input_bytes)
  end
  if size > lim.limit_input_bytes + ENVELOPE_BYTES then
    return refuse('too_large', 'the entry has ' .. size .. ' bytes, over the limit of '
                  .. (lim.limit_input_bytes + ENVELOPE_BYTES) .. ' (the input limit and '
                  .. ENVELOPE_BYTES .. ' bytes for the other fields)')
  end
  if session == nil or input == nil then
    return refuse('invalid_input', 'an entry needs the fields `session` and `input`')
  end
  if not valid_session(session) then
    return refuse('invalid_input', '`session` must be 1-128 characters of [A-Za-z0-9._:/-]')
  end
  local misplaced = wrong_partition(partitions, suffix, session)
  if misplaced then return misplaced end
  -- Read even when no count is needed: a login scoped to one tenant's keys may not read another
  -- tenant's meta, and that refusal is the tenant check at submit.
  local counts = redis.pcall('HMGET', prefix .. ':{' .. session .. '}:meta', 'n_msgs', 'n_branches')
  if type(counts) == 'table' and counts.err then
    -- Redis 7.0 words an ACL refusal in a function this way; later versions say NOPERM.
    if string.find(counts.err, 'NOPERM', 1, true)
        or string.find(counts.err, "can't access", 1, true) then
      return refuse('wrong_tenant', 'session ' .. session .. " is outside this producer's keys")
    end
    return counts
  end
  local ok, value = pcall(cjson.decode, input)
  -- An `input` that does not parse is left to the dispatcher, which refuses it exactly.
  if ok and type(value) == 'table' and value['type'] == 'message.create' then
    local n_msgs, n_branches = tonumber(counts[1]) or 0, tonumber(counts[2]) or 0
    if n_msgs >= lim.limit_messages then
      return refuse('session_full', 'session ' .. session .. ' has ' .. n_msgs
                    .. ' messages, the limit')
    end
    -- Whether a message makes a new branch needs the tree; one that follows the active head
    -- (no `parent_id`) usually does not, so only one naming its parent is refused here, and
    -- the dispatcher decides exactly.
    if n_branches >= lim.limit_branches and value['parent_id'] ~= nil then
      return refuse('session_full', 'session ' .. session .. ' has ' .. n_branches
                    .. ' branches, the limit')
    end
  end
  local pending = tonumber(redis.call('HGET', keys[2], session)) or 0
  if pending >= lim.limit_pending then
    return refuse('rate_limited', pending .. ' inputs of session ' .. session .. ' are pending')
  end
  local fields = {}
  for i = 3, #args do fields[#fields + 1] = args[i] end
  fields[#fields + 1] = 'admitted'
  fields[#fields + 1] = '1'
  local id = redis.call('XADD', keys[1], '*', unpack(fields))
  redis.call('HINCRBY', keys[2], session, 1)
  return id
end

redis.register_function('parley_submit', submit)
redis.register_function{function_name = 'parley_version', callback = function() return VERSION end,
                        flags = {'no-writes'}}
