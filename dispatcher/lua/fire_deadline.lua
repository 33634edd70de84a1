-- Hand a due interrupt deadline to its session's results stream, exactly once, whichever
-- dispatcher sees it first.
-- KEYS[1] the deadlines sorted set (member: session \x1f interrupt id, score: deadline ms)
-- KEYS[2] the session's results stream
-- ARGV[1] the member, ARGV[2] now (Unix ms), ARGV[3] the 'deadline' work outcome JSON
-- Returns 1 when posted, 0 when not due or already taken.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) > tonumber(ARGV[2]) then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('XADD', KEYS[2], '*', 'outcome', ARGV[3])
return 1
