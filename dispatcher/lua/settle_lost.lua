-- Post the loss of a job whose worker died, exactly once, whichever dispatcher sees it first.
-- KEYS[1] the running-jobs hash, KEYS[2] the session's results stream, KEYS[3] the in-flight hash
-- ARGV[1] RQ job id, ARGV[2] the record as read (compared: unchanged since), ARGV[3] outcome JSON
-- Returns 1 when posted, 0 when the record changed or is gone.
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return 0
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('XADD', KEYS[2], '*', 'outcome', ARGV[3])
return 1
