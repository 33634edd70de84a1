-- requires: finish_lib
-- Take the next job for a worker in one round trip: pop it, record it as running on this
-- worker, and return its RQ job hash. Popping and recording in one script leaves no moment
-- at which a job is neither queued nor recorded (a kill -9 can't fall between the two).
-- The same call can first finish the job the worker has just run (post its outcome, delete its
-- records and its hash, as the outcome's MULTI did): one round trip per job instead of two.
-- KEYS: the RQ queue lists, in priority order
-- ARGV[1] worker id ('' = record nothing), ARGV[2] the RQ job key prefix ('rq:job:'),
-- ARGV[3] a job id already popped by a blocking wait ('' = pop one here),
-- ARGV[4] the running hash, ARGV[5] the in-flight hash,
-- ARGV[6] this worker's last-take key, ARGV[7] this take's secret (random, 128 bits),
-- ARGV[8] '1' = name this server in the reply (--replica-acks: the take is confirmed by a WAIT
-- on the same server only; workers/takes.py, confirm_take),
-- ARGV[9] the queue the blocking wait popped ARGV[3] from (one of KEYS; '' with ARGV[3] ''),
-- optional, to finish a job first: ARGV[10] its id ('' = none), ARGV[11] the results stream to
-- post its outcome to ('' = post nothing), ARGV[12] the outcome (JSON), ARGV[13] the job's
-- in-flight order key (its queue's numbering), ARGV[14] '0' = finish only, take nothing,
-- ARGV[15] its in-flight record as its take read it ('' = none; finish_lib.lua),
-- ARGV[16] the job token keys' prefix ('parley:jobtoken:'), ARGV[17] the finished job's
-- outcome signed by its token ('' = none)
-- Returns nil when nothing is taken (every queue empty, or ARGV[14] '0'), else
-- {job id, queue key, claimed, job hash fields, its in-flight record ('' = none), this
-- server's run_id, its master_replid ('' and '' unless ARGV[8] is '1'), the job's token ('' =
-- none: the outcome of the job could not be proven, so it is not run)}. claimed: 1 recorded
-- as running on this worker, 0 not (no worker id, or cancelled: no fields), -1 the popped job
-- ARGV[3] is held by another worker (nothing done; no fields), -2 not issued by a dispatcher
-- (no in-flight record) and -3 changed since it was issued: dropped unrun (no fields).
-- finish_lib.lua is prepended (the records of the job finished).
-- Only the queues are KEYS so that the worker's ACL (rq:* keys) admits the call; the job hash's
-- name is only known after the pop, and the other keys are checked by ACL command by command.
--
-- A worker whose call got no reply (Redis went away) calls again with the same secret and gets
-- the job the first call took, if it ran: a job is never recorded as running on a live worker
-- that does not know it has it (no dispatcher would ever post its loss). A call that finished a
-- job always leaves its record, so that its retry returns what it took (nothing included) and
-- never posts the outcome a second time.
-- The record (ARGV[6], `took`) holds the secret's SHA-1, never the secret, and the job's token
-- masked by a pad derived from the secret: every worker may read every record (one login), and
-- the retry must get back the token the lost reply carried, which no other worker may learn.
-- Only the call's own arguments carried the secret, so only the worker that made it can unmask.
--
-- A job popped by the blocking wait (ARGV[3]) was popped by a separate BLPOP, perhaps on another
-- server: after a failover that lost that pop, the server reached now (the promoted replica)
-- still has the job queued, and claiming it without the pop would run it while another worker
-- pops it and runs it again. So the claim re-does the pop: LREM of the job from the queue
-- BLPOP named. 1 means this server never saw the pop, and the LREM is the pop, atomic with
-- the claim; 0 means it saw it (or another worker popped it here: then parley:running names
-- that worker once it has claimed it, and the job is refused, touching nothing). Of the two
-- ways to make a blocking pop provable (this one, or BLMOVE into a per-worker list and claim
-- only what an LREM from that list finds), BLMOVE watches one source list, and a worker blocks
-- on all its queues at once, in priority order: BLPOP it stays.
-- The job's token masked (sign 1) or unmasked (-1) by the pad of the take's secret: hex digit
-- by hex digit, plus or minus the pad's digit mod 16 (a one-time pad; a token is 64 hex digits,
-- the pad 80: two SHA-1s, each of the secret under its own label).
local function masked(token, sign)
  if token == '' then
    return ''
  end
  local pad = redis.sha1hex('parley-take-pad-1\n' .. ARGV[7]) .. redis.sha1hex('parley-take-pad-2\n' .. ARGV[7])
  local out = {}
  for i = 1, #token do
    local t = tonumber(string.sub(token, i, i), 16) or 0
    local m = tonumber(string.sub(pad, i, i), 16)
    out[i] = string.format('%x', (t + sign * m) % 16)
  end
  return table.concat(out)
end
-- the take's secret as the last-take record holds it (a worker with no id records nothing)
local secret_hash = ARGV[1] ~= '' and redis.sha1hex(ARGV[7]) or ''
local function server()
  if ARGV[8] ~= '1' then
    return '', ''
  end
  -- the server process (a restart or another server, a promoted replica, has another run_id)
  -- and its replication history (master_replid changes when it is promoted, and when it is
  -- fully resynced as a replica: a server demoted, resynced from the new primary, losing the
  -- take, then promoted again keeps its run_id, never its master_replid)
  local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or ''
  local replid = string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)') or ''
  return run_id, replid
end
-- Only a job a dispatcher issued runs. Its in-flight record, which dispatchers alone write
-- (workers may read parley:inflight, never write it: deploy/redis/users.acl), holds the
-- digest of the function and arguments the dispatcher enqueued. A job hash with no record
-- (-2: made up by someone who may write rq:* keys, as any worker may) or whose `data` is not
-- what the dispatcher wrote (-3: changed since) is not run; 0: it is the job issued.
local function not_issued(record, fields)
  local decoded, entry = false, nil
  if record then
    decoded, entry = pcall(cjson.decode, record)
  end
  if not decoded or type(entry) ~= 'table' or type(entry['digest']) ~= 'string' then
    return -2
  end
  local data = ''
  for i = 1, #fields, 2 do
    if fields[i] == 'data' then
      data = fields[i + 1]
      break
    end
  end
  if redis.sha1hex(data) ~= entry['digest'] then
    return -3
  end
  return 0
end
-- A job refused so (`code`, -2 or -3) is dropped: its hash deleted, never run. A real job's
-- in-flight record stays, so the unclaimed-work sweep hands it back as lost.
-- Its token goes with it (GETDEL: the only way a worker may delete one), so no key of a job
-- that will never be taken waits out the token's time.
local function dropped(id, queue, code)
  redis.call('DEL', ARGV[2] .. id)
  redis.call('GETDEL', ARGV[16] .. id)
  return {id, queue, code, {}, '', '', '', ''}
end
if ARGV[1] ~= '' then
  local last = redis.call('GET', ARGV[6])
  if last then
    local secret, was_claimed, job, hidden = string.match(last, '^(%x+) (%d) (%S*) (%x*)$')
    if secret == secret_hash then
      if job == '' then
        return nil  -- that call finished a job and took nothing
      end
      -- the in-flight record only if that call claimed the job: one that claimed nothing read
      -- none, and an outcome must then delete the records unguarded (finish_lib.lua)
      local run_id, replid = server()
      if was_claimed ~= '1' then
        -- nothing claimed (cancelled, or dropped as not issued): nothing to run, whatever a
        -- job hash of that id may hold now
        return {job, '', 0, {}, '', run_id, replid, ''}
      end
      -- what that call claimed, checked again: its hash may have been changed since
      local record = redis.call('HGET', ARGV[5], job)
      local fields = redis.call('HGETALL', ARGV[2] .. job)
      if #fields > 0 then
        local refused = not_issued(record, fields)
        if refused ~= 0 then
          redis.call('HDEL', ARGV[4], job)  -- our running record of it: it will not run
          return dropped(job, '', refused)
        end
      end
      -- its token, read by the first call and kept masked in the record for this retry
      return {job, '', 1, fields, record or '', run_id, replid, masked(hidden, -1)}
    end
  end
end
local finished = ARGV[10] or ''
if finished ~= '' then
  -- the outcome, then every record of the job and its hash (RQ would delete a finished job
  -- with result_ttl 0 too), unless they belong to a job enqueued again under its id
  if ARGV[11] ~= '' then
    if (ARGV[17] or '') ~= '' then
      redis.call('XADD', ARGV[11], '*', 'outcome', ARGV[12], 'job_sig', ARGV[17])
    else
      redis.call('XADD', ARGV[11], '*', 'outcome', ARGV[12])
    end
  end
  finish_records(ARGV[4], ARGV[5], ARGV[13], ARGV[2] .. finished, finished, ARGV[15] or '')
end
local function took(claimed, id, token)
  if ARGV[1] ~= '' then
    redis.call('SET', ARGV[6], secret_hash .. ' ' .. claimed .. ' ' .. id .. ' ' .. masked(token or '', 1),
               'PX', 600000)
  end
end
local id = ARGV[3]
local queue = ''
if id ~= '' then
  queue = ARGV[9] or ''
  -- held by another worker: it popped the job here (this server never saw our pop) and
  -- claimed it first; a worker with no id records nothing, so any running record is another's
  local held = redis.call('HGET', ARGV[4], id)
  local mine = '{"worker":' .. cjson.encode(ARGV[1]) .. ','
  if held and (ARGV[1] == '' or string.sub(held, 1, #mine) ~= mine) then
    return {id, queue, -1, {}, '', '', '', ''}
  end
  if queue ~= '' then
    redis.call('LREM', queue, 1, id)  -- 1: the pop was lost here, and this is it
  end
else
  if ARGV[14] ~= '0' then
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
  return {id, queue, 0, fields, '', '', '', ''}
end
-- A job no dispatcher issued as it is now (not_issued above) is not run.
local record = redis.call('HGET', ARGV[5], id)
local refused = not_issued(record, fields)
if refused ~= 0 then
  if finished ~= '' then
    took(0, id)
  end
  return dropped(id, queue, refused)
end
local claimed = 0
local taken = ''
if ARGV[1] ~= '' then
  -- The running record is the dispatcher's in-flight record (a JSON object holding at least its
  -- digest: not_issued checked it) plus who runs it: everything a dispatcher needs to post the
  -- loss if this worker dies.
  redis.call('HSET', ARGV[4], id, '{"worker":' .. cjson.encode(ARGV[1]) .. ',' .. string.sub(record, 2))
  claimed = 1
  taken = record
end
-- The job's token, read and deleted in the take itself: the outcome signed with it is the
-- only one a dispatcher applies, so only the worker that took the job can answer it (and a
-- worker that reads tokens of queued jobs takes them: their real takers find none, and do
-- not run them). Workers may GETDEL token keys, never GET or SET them (deploy/redis/users.acl):
-- a token read is gone, and nobody but a dispatcher can put one back.
local token = redis.call('GETDEL', ARGV[16] .. id) or ''
took(claimed, id, token)
local run_id, replid = server()
return {id, queue, claimed, fields, taken, run_id, replid, token}
