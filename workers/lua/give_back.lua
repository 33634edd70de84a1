-- requires: finish_lib
-- Give back a job a worker took and did not run (its take unconfirmed by replicas, or the
-- worker stops: a stop request during its last finish, --max-jobs, an error). The job is not
-- pushed back onto its queue: its token went with the take (take_job.lua), and a worker may not
-- write one back (a login that could put a token back could read one and put it back unseen,
-- then answer the job in its real taker's place). Instead the taker posts the job's `unrun`
-- outcome, signed with the token, and deletes the job's records as a finished job's are: the
-- dispatcher issues the job again (a new attempt, with a new token), whatever the tool, since
-- only the worker that took the job can sign its word that nothing ran.
-- Nothing is posted when a dispatcher has already settled the job (its in-flight record is gone:
-- its loss posted once this worker's heartbeat lapsed, or cancelled; the job hash is deleted),
-- or when its records belong to a job enqueued again under its id since (finish_lib.lua).
-- Only if this server holds the take: the worker's last-take record (take_job.lua) names this
-- take's secret and job. After a failover, or a restart that lost the take, it does not: the job
-- is still queued there with its token (a take pops, records and reads the token in one step),
-- or was lost with the transition that enqueued it (whose replay enqueues it again), or was
-- enqueued again by that replay; in each case it runs from there, and its records are not this
-- take's. Nothing is touched then. The record is consumed, so a retry of a call that got no
-- reply posts nothing a second time.
-- KEYS[1] the job hash
-- ARGV[1] the job id, ARGV[2] the running hash, ARGV[3] the in-flight hash, ARGV[4] this
-- worker's last-take key, ARGV[5] the take's secret ('' = a worker with no id, which records
-- no take: given back unchecked), ARGV[6] '1' = the take claimed the job (recorded it as
-- running), '0' = not: read only when ARGV[5] is '' (the last-take record says it otherwise),
-- ARGV[7] the results stream ('' = none: the running record goes, and the in-flight record
-- stays for the unclaimed-work sweep to hand the job back as lost), ARGV[8] the job's unrun
-- outcome (JSON), ARGV[9] it signed with the job's token, ARGV[10] the job's in-flight order
-- key, ARGV[11] its in-flight record as the take read it ('' = none)
-- Only the job hash is in KEYS, so that the worker's ACL (rq:* keys) admits the call (as
-- take_job.lua).
-- Returns 1 given back, 0 settled meanwhile (nothing posted), -1 this server does not hold the
-- take (nothing done).
local claimed = ARGV[6] or '1'
if ARGV[5] ~= '' then
  local last = redis.call('GET', ARGV[4])
  local secret, was_claimed, job = string.match(last or '', '^(%x+) (%d) (%S*) %x*$')
  if secret ~= redis.sha1hex(ARGV[5]) or job ~= ARGV[1] then
    return -1
  end
  claimed = was_claimed
  redis.call('SET', ARGV[4], 'given-back', 'PX', 600000)
end
if not redis.call('HGET', ARGV[3], ARGV[1]) then
  if claimed == '1' then
    redis.call('HDEL', ARGV[2], ARGV[1])
  end
  redis.call('DEL', KEYS[1])
  return 0
end
if ARGV[7] == '' then
  if claimed == '1' then
    redis.call('HDEL', ARGV[2], ARGV[1])
  end
  return 1
end
if finish_records(ARGV[2], ARGV[3], ARGV[10], KEYS[1], ARGV[1], ARGV[11] or '') == 0 then
  return 0
end
redis.call('XADD', ARGV[7], '*', 'outcome', ARGV[8], 'job_sig', ARGV[9])
return 1
