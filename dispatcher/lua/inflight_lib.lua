-- Record an enqueued job as in flight, numbered in enqueue order, in the same atomic step as its
-- push (commit.lua for the jobs of the transition it commits; record_inflight.lua for an enqueue
-- an older dispatcher left in an outbox), so the numbers of one queue's jobs follow the queue's
-- own order: the unclaimed-work sweep then knows, from the number of the queue's head alone,
-- which in-flight jobs have left the queue, without looking for any job in the queue.
-- The number is one above the queue's highest: every job still queued is in the zset (it
-- leaves only once answered, cancelled or found lost), so a new job numbers above all of them
-- whatever happened before. No counter is kept that an operator could reset.
local function record_inflight(inflight, order, id, record)
  redis.call('HSET', inflight, id, record)
  local top = redis.call('ZRANGE', order, -1, -1, 'WITHSCORES')  -- the highest
  local n = 1
  if top[2] then n = tonumber(top[2]) + 1 end
  redis.call('ZADD', order, n, id)
end
