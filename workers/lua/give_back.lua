-- Give back a job a worker took and did not run (it stops: a stop request during its last
-- finish, --max-jobs, an error): its running record goes, and it is pushed back at the head of
-- its queue, unless its in-flight record is gone. Then a dispatcher has already settled it
-- (posted its loss once this worker's heartbeat lapsed, or cancelled it): pushed back, it would
-- run beside its retry, or after its call was settled; its job hash is deleted instead.
-- KEYS[1] the queue, KEYS[2] the running hash, KEYS[3] the in-flight hash, KEYS[4] the job hash
-- ARGV[1] the job id
-- Returns 1 given back, 0 settled meanwhile (nothing pushed back).
redis.call('HDEL', KEYS[2], ARGV[1])
if not redis.call('HGET', KEYS[3], ARGV[1]) then
  redis.call('DEL', KEYS[4])
  return 0
end
redis.call('LPUSH', KEYS[1], ARGV[1])
return 1
