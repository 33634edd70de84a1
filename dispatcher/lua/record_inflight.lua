-- requires: inflight_lib
-- Record an enqueued job as in flight (inflight_lib.lua, prepended): for an enqueue an older
-- dispatcher left in an outbox, run in the outbox's MULTI right after RQ's RPUSH.
-- KEYS[1] the in-flight hash, KEYS[2] the queue's in-flight order (zset)
-- ARGV[1] RQ job id, ARGV[2] the in-flight record (JSON)
record_inflight(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
return 1
