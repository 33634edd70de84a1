-- Take the next job for a worker in one round trip: pop it, record it as running on this
-- worker, and return its RQ job hash. Popping and recording in one script leaves no moment
-- at which a job is neither queued nor recorded (a kill -9 can't fall between the two).
-- KEYS: the RQ queue lists, in priority order
-- ARGV[1] worker id ('' = record nothing), ARGV[2] the RQ job key prefix ('rq:job:'),
-- ARGV[3] a job id already popped by a blocking wait ('' = pop one here),
-- ARGV[4] the running hash, ARGV[5] the in-flight hash,
-- ARGV[6] this worker's last-take key, ARGV[7] this take's token
-- Returns nil when every queue is empty, else {job id, queue key, claimed 0/1, job hash fields}.
-- Only the queues are KEYS so that the worker's ACL (rq:* keys) admits the call; the job hash's
-- name is only known after the pop, and the other keys are checked by ACL command by command.
--
-- A worker whose call got no reply (Redis went away) calls again with the same token and gets
-- the job the first call took, if it ran: a job is never recorded as running on a live worker
-- that does not know it has it (no dispatcher would ever post its loss).
if ARGV[1] ~= '' then
  local last = redis.call('GET', ARGV[6])
  if last then
    local token, was_claimed, job = string.match(last, '^(%S+) (%d) (.+)$')
    if token == ARGV[7] then
      return {job, '', tonumber(was_claimed), redis.call('HGETALL', ARGV[2] .. job)}
    end
  end
end
local id = ARGV[3]
local queue = ''
if id == '' then
  for i = 1, #KEYS do
    local popped = redis.call('LPOP', KEYS[i])
    if popped then
      id = popped
      queue = KEYS[i]
      break
    end
  end
  if id == '' then
    return nil
  end
end
local fields = redis.call('HGETALL', ARGV[2] .. id)
if #fields == 0 then
  -- cancelled between its enqueue and now: nothing to run
  return {id, queue, 0, fields}
end
local claimed = 0
if ARGV[1] ~= '' then
  -- The running record is the dispatcher's in-flight record plus who runs it: everything a
  -- dispatcher needs to post the loss if this worker dies. A job with no in-flight record
  -- (not enqueued by a dispatcher) is recorded by the job itself, as with any RQ worker.
  local record = redis.call('HGET', ARGV[5], id)
  if record and string.sub(record, 1, 1) == '{' and string.len(record) > 2 then
    redis.call('HSET', ARGV[4], id, '{"worker":' .. cjson.encode(ARGV[1]) .. ',' .. string.sub(record, 2))
    claimed = 1
  end
end
if ARGV[1] ~= '' then
  redis.call('SET', ARGV[6], ARGV[7] .. ' ' .. claimed .. ' ' .. id, 'PX', 600000)
end
return {id, queue, claimed, fields}
