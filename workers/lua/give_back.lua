-- Give back a job a worker took and did not run (its take unconfirmed by replicas, or the
-- worker stops: a stop request during its last finish, --max-jobs, an error): its running
-- record goes, and it is pushed back at the head of its queue, unless its in-flight record is
-- gone. Then a dispatcher has already settled it (posted its loss once this worker's heartbeat
-- lapsed, or cancelled it): pushed back, it would run beside its retry, or after its call was
-- settled; its job hash is deleted instead.
-- Only if this server holds the take: the worker's last-take record (take_job.lua) names this
-- take's token and job. After a failover, or a restart that lost the take, it does not: the job
-- is still queued there (a take pops and records in one step), or was lost with the transition
-- that enqueued it (whose replay enqueues it again), or was enqueued again by that replay; in
-- each case pushing it would queue it twice (run twice), and its records are not this take's.
-- Nothing is touched then. The record is consumed, so a retry of a call that got no reply
-- pushes nothing a second time.
-- A job the take did not claim (no in-flight record: not enqueued by a dispatcher, so none to
-- settle it either) is pushed back as it was taken, its running record (another's, if any)
-- left alone; its hash gone (cancelled meanwhile), there is nothing to push back.
-- KEYS[1] the queue, KEYS[2] the job hash
-- ARGV[1] the job id, ARGV[2] the running hash, ARGV[3] the in-flight hash, ARGV[4] this
-- worker's last-take key, ARGV[5] the take's token ('' = a worker with no id, which records
-- no take: given back unchecked), ARGV[6] '1' = the take claimed the job (recorded it as
-- running), '0' = not: read only when ARGV[5] is '' (the last-take record says it otherwise),
-- ARGV[7] the job's token key, ARGV[8] its token as the take read it ('' = none): put back
-- with the job, for its next taker (workers/lua/take_job.lua; the dispatcher checks an
-- outcome against the token it derives itself, so a token a worker writes proves nothing)
-- Only rq:* keys are KEYS, so that the worker's ACL admits the call (as take_job.lua).
-- Returns 1 given back, 0 settled meanwhile (nothing pushed back), -1 this server does not hold
-- the take (nothing done).
local claimed = ARGV[6] or '1'
if ARGV[5] ~= '' then
  local last = redis.call('GET', ARGV[4])
  local token, was_claimed, job = string.match(last or '', '^(%S+) (%d) (.*)$')
  if token ~= ARGV[5] or job ~= ARGV[1] then
    return -1
  end
  claimed = was_claimed
  redis.call('SET', ARGV[4], 'given-back', 'PX', 600000)
end
local function token_back()
  if (ARGV[8] or '') ~= '' then
    redis.call('SET', ARGV[7], ARGV[8], 'PX', 604800000)  -- dispatcher/enqueue.py JOB_TOKEN_TTL_MS
  end
end
if claimed ~= '1' then
  if redis.call('EXISTS', KEYS[2]) == 0 then
    return 0
  end
  redis.call('LPUSH', KEYS[1], ARGV[1])
  token_back()
  return 1
end
redis.call('HDEL', ARGV[2], ARGV[1])
if not redis.call('HGET', ARGV[3], ARGV[1]) then
  redis.call('DEL', KEYS[2])
  return 0
end
redis.call('LPUSH', KEYS[1], ARGV[1])
token_back()
return 1
