-- Shared by the scripts that copy a whole session out (prepended to each): the session's raw
-- document, built by concatenation so no stored JSON is parsed (or re-encoded) here:
--   {"session": S, "core": <stored core JSON or null>, "messages": [<stored message JSON>...],
--    "events": [{"id": <stream id>, "event": <stored event JSON>}...]}
-- Messages come in hash order; parley/client/export.py orders and shapes them (a tree).
local function session_document(meta, msgs, events, session)
  local core = redis.call('HGET', meta, 'core')
  local items = {}
  for i, e in ipairs(redis.call('XRANGE', events, '-', '+')) do
    local event, fields = 'null', e[2]
    for j = 1, #fields, 2 do
      if fields[j] == 'event' then event = fields[j + 1] end
    end
    items[i] = '{"id":"' .. e[1] .. '","event":' .. event .. '}'
  end
  return table.concat({'{"session":', cjson.encode(session), ',"core":', core or 'null',
                       ',"messages":[', table.concat(redis.call('HVALS', msgs), ','),
                       '],"events":[', table.concat(items, ','), ']}'})
end
