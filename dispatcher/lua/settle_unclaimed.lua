-- Post the loss of a job that left its queue but was never recorded as running (its worker
-- died between RQ's dequeue and the job's first line), exactly once.
-- KEYS[1] the in-flight hash, KEYS[2] the running hash, KEYS[3] the session's results stream,
-- KEYS[4] the RQ job hash (deleted, so RQ's own cleanup can never run the job after all),
-- KEYS[5] the queue's in-flight order
-- ARGV[1] RQ job id, ARGV[2] the in-flight record as read, ARGV[3] the 'lost' outcome JSON
-- Returns 1 when posted, 0 when the job was answered, claimed or changed meanwhile.
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] or redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then
  return 0
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('DEL', KEYS[4])
redis.call('XADD', KEYS[3], '*', 'outcome', ARGV[3])
return 1
