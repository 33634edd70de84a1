-- requires: finish_lib
-- Post a job's outcome and delete its records (finish_lib.lua, prepended): what a worker with
-- --replica-acks does after each job (the lean path's deferred post rides take_job.lua instead),
-- and what a stopped job does without an outcome.
-- KEYS[1] the RQ job hash ('' not allowed; pass ARGV[7] '0' to keep it)
-- ARGV[1] the job id, ARGV[2] the results stream ('' = post nothing), ARGV[3] the outcome
-- (JSON), ARGV[4] the running hash, ARGV[5] the in-flight hash, ARGV[6] the queue's in-flight
-- order, ARGV[7] '1' = delete the job hash, ARGV[8] the in-flight record as the take read it
-- ('' = none: unguarded), ARGV[9] the outcome signed with the job's token ('' = none)
-- Only the job hash is a KEY, so that the worker's ACL (rq:* keys) admits the call; the other
-- keys are checked by ACL command by command.
-- Returns 1 records deleted, 0 left alone: they belong to a job re-created under the same id.
if ARGV[2] ~= '' then
  if (ARGV[9] or '') ~= '' then
    redis.call('XADD', ARGV[2], '*', 'outcome', ARGV[3], 'job_sig', ARGV[9])
  else
    redis.call('XADD', ARGV[2], '*', 'outcome', ARGV[3])
  end
end
local job_key = ''
if ARGV[7] == '1' then
  job_key = KEYS[1]
end
return finish_records(ARGV[4], ARGV[5], ARGV[6], job_key, ARGV[1], ARGV[8])
