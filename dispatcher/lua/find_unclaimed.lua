-- One step of the unclaimed-work sweep over one queue: in-flight jobs that have left the queue
-- and are not recorded as running, at most ARGV[2] of them, walking the queue's in-flight order
-- from a cursor. Jobs still queued are never looked at: a queue is FIFO and its jobs are
-- numbered in push order (record_inflight.lua), so every in-flight job numbered below the
-- queue's head has left it (a cancel removes the record with the job).
-- KEYS[1] the RQ queue (list), KEYS[2] its in-flight order (zset), KEYS[3] the in-flight hash,
-- KEYS[4] the running hash
-- ARGV[1] the cursor: the number looked at last ('' = from the lowest), ARGV[2] the step's size
-- Returns {next cursor ('' when this walk is done), job id, in-flight record, ...}.
local limit = tonumber(ARGV[2])
local below = '+inf'  -- an empty queue: every in-flight job has left it
local ahead = redis.call('LRANGE', KEYS[1], 0, 15)
if #ahead > 0 then
  below = nil
  -- The head may be a job without a record (enqueued by hand, or by an older dispatcher):
  -- the first numbered job near the head bounds the walk as well.
  for i = 1, #ahead do
    local seq = redis.call('ZSCORE', KEYS[2], ahead[i])
    if seq then
      below = '(' .. seq
      break
    end
  end
  if not below then
    return {''}  -- nothing numbered near the head: wait for the queue to move
  end
end
local from = '-inf'
if ARGV[1] ~= '' then
  from = '(' .. ARGV[1]
end
local entries = redis.call('ZRANGEBYSCORE', KEYS[2], from, below, 'WITHSCORES', 'LIMIT', 0, limit)
local out = {''}
for i = 1, #entries, 2 do
  local job = entries[i]
  local record = redis.call('HGET', KEYS[3], job)
  if not record then
    redis.call('ZREM', KEYS[2], job)  -- answered or lost by a path that left its number behind
  elseif redis.call('HEXISTS', KEYS[4], job) == 0 then
    out[#out + 1] = job
    out[#out + 1] = record
  end
end
if #entries == 2 * limit then
  out[1] = entries[#entries]  -- more may follow: the next step goes on from here
end
return out
