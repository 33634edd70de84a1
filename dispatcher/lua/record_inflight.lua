-- Record an enqueued job as in flight, numbered in enqueue order. commit.lua does the same for
-- the jobs of the transition it commits; this script is for an enqueue an older dispatcher left
-- in an outbox, run in the outbox's MULTI right after RQ's RPUSH, so the numbers of one queue's
-- jobs follow the queue's own order: the unclaimed-work sweep then knows, from the number of
-- the queue's head alone, which in-flight jobs have left the queue, without looking for any job
-- in the queue.
-- The number is one above the queue's highest: every job still queued is in the zset (it
-- leaves only once answered, cancelled or found lost), so a new job numbers above all of them
-- whatever happened before. No counter is kept that an operator could reset.
-- KEYS[1] the in-flight hash, KEYS[2] the queue's in-flight order (zset)
-- ARGV[1] RQ job id, ARGV[2] the in-flight record (JSON)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local top = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')  -- the highest
local n = 1
if top[2] then n = tonumber(top[2]) + 1 end
redis.call('ZADD', KEYS[2], n, ARGV[1])
return 1
