-- Take the next job for a worker in one round trip: pop it, record it as running on this
-- worker, and return its RQ job hash. Popping and recording in one script leaves no moment
-- at which a job is neither queued nor recorded (a kill -9 can't fall between the two).
-- The same call can first finish the job the worker has just run (post its outcome, delete its
-- records and its hash, as the outcome's MULTI did): one round trip per job instead of two.
-- KEYS: the RQ queue lists, in priority order
-- ARGV[1] worker id ('' = record nothing), ARGV[2] the RQ job key prefix ('rq:job:'),
-- ARGV[3] a job id already popped by a blocking wait ('' = pop one here),
-- ARGV[4] the running hash, ARGV[5] the in-flight hash,
-- ARGV[6] this worker's last-take key, ARGV[7] this take's token,
-- ARGV[8] '1' = name this server in the reply (--replica-acks: the take is confirmed by a WAIT
-- on the same server only; workers/worker.py, confirm_take),
-- optional, to finish a job first: ARGV[9] its id ('' = none), ARGV[10] the results stream to
-- post its outcome to ('' = post nothing), ARGV[11] the outcome (JSON), ARGV[12] the job's
-- in-flight order key (its queue's numbering), ARGV[13] '0' = finish only, take nothing,
-- ARGV[14] its in-flight record as its take read it ('' = none; finish_lib.lua)
-- Returns nil when nothing is taken (every queue empty, or ARGV[13] '0'), else
-- {job id, queue key, claimed 0/1, job hash fields, its in-flight record ('' = none), this
-- server's run_id ('' unless ARGV[8] is '1')}.
-- finish_lib.lua is prepended (the records of the job finished).
-- Only the queues are KEYS so that the worker's ACL (rq:* keys) admits the call; the job hash's
-- name is only known after the pop, and the other keys are checked by ACL command by command.
--
-- A worker whose call got no reply (Redis went away) calls again with the same token and gets
-- the job the first call took, if it ran: a job is never recorded as running on a live worker
-- that does not know it has it (no dispatcher would ever post its loss). A call that finished a
-- job always leaves its token, so that its retry returns what it took (nothing included) and
-- never posts the outcome a second time.
local function server()
  if ARGV[8] ~= '1' then
    return ''
  end
  -- the server process: a restart or another server (a promoted replica) has another run_id
  return string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or ''
end
if ARGV[1] ~= '' then
  local last = redis.call('GET', ARGV[6])
  if last then
    local token, was_claimed, job = string.match(last, '^(%S+) (%d) (.*)$')
    if token == ARGV[7] then
      if job == '' then
        return nil  -- that call finished a job and took nothing
      end
      return {job, '', tonumber(was_claimed), redis.call('HGETALL', ARGV[2] .. job),
              redis.call('HGET', ARGV[5], job) or '', server()}
    end
  end
end
local finished = ARGV[9] or ''
if finished ~= '' then
  -- the outcome, then every record of the job and its hash (RQ would delete a finished job
  -- with result_ttl 0 too), unless they belong to a job enqueued again under its id
  if ARGV[10] ~= '' then
    redis.call('XADD', ARGV[10], '*', 'outcome', ARGV[11])
  end
  finish_records(ARGV[4], ARGV[5], ARGV[12], ARGV[2] .. finished, finished, ARGV[14] or '')
end
local function took(claimed, id)
  if ARGV[1] ~= '' then
    redis.call('SET', ARGV[6], ARGV[7] .. ' ' .. claimed .. ' ' .. id, 'PX', 600000)
  end
end
local id = ARGV[3]
local queue = ''
if id == '' then
  if ARGV[13] ~= '0' then
    for i = 1, #KEYS do
      local popped = redis.call('LPOP', KEYS[i])
      if popped then
        id = popped
        queue = KEYS[i]
        break
      end
    end
  end
  if id == '' then
    if finished ~= '' then
      took(0, '')
    end
    return nil
  end
end
local fields = redis.call('HGETALL', ARGV[2] .. id)
if #fields == 0 then
  -- cancelled between its enqueue and now: nothing to run
  if finished ~= '' then
    took(0, id)
  end
  return {id, queue, 0, fields, '', ''}
end
local claimed = 0
local taken = ''
if ARGV[1] ~= '' then
  -- The running record is the dispatcher's in-flight record plus who runs it: everything a
  -- dispatcher needs to post the loss if this worker dies. A job with no in-flight record
  -- (not enqueued by a dispatcher) is recorded by the job itself, as with any RQ worker.
  local record = redis.call('HGET', ARGV[5], id)
  if record and string.sub(record, 1, 1) == '{' and string.len(record) > 2 then
    redis.call('HSET', ARGV[4], id, '{"worker":' .. cjson.encode(ARGV[1]) .. ',' .. string.sub(record, 2))
    claimed = 1
    taken = record
  end
end
took(claimed, id)
return {id, queue, claimed, fields, taken, server()}
