-- Delete the records of a job a worker is done with (its outcome posted, or it was stopped):
-- its running and in-flight records, its place in its queue's in-flight order, its RQ job hash.
-- Prepended to take_job.lua and finish_job.lua, so that both paths keep one rule.
-- `taken`: the job's in-flight record as the worker's take read it ('' = it had none: a job not
-- enqueued by a dispatcher, whose records are deleted as they always were). A job id is
-- derived from (session, work, attempt), so a dispatcher that replays a transition a failover
-- lost enqueues a job of the same id again, with an in-flight record of its own (another
-- enqueue time, `at`). The records then belong to that job, not to the one finished here
-- (whose take the failover lost too): they are left alone, and 0 returned.
local function finish_records(running, inflight, order, job_key, id, taken)
  if taken ~= '' then
    local now = redis.call('HGET', inflight, id)
    if now and now ~= taken then
      return 0
    end
  end
  redis.call('HDEL', running, id)
  redis.call('HDEL', inflight, id)
  redis.call('ZREM', order, id)
  if job_key ~= '' then
    redis.call('DEL', job_key)
  end
  return 1
end
