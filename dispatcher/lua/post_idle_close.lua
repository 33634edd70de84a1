-- The idle sweep's close of one session, written once: only while the session is still due
-- in the idle set at the score the sweep read (a transition since moved or removed it).
-- KEYS[1] the idle sorted set
-- KEYS[2] the session's input stream
-- ARGV[1] the session id
-- ARGV[2] the score the sweep read (Unix ms)
-- ARGV[3 ..] the input entry's fields and values (signed by the engine's key)
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('XADD', KEYS[2], '*', unpack(ARGV, 3))
return 1
