-- Record an enqueued job as in flight, numbered in enqueue order. Run in the outbox's MULTI
-- right after RQ's RPUSH, so the numbers of one queue's jobs follow the queue's own order: the
-- unclaimed-work sweep then knows, from the number of the queue's head alone, which in-flight
-- jobs have left the queue, without looking for any job in the queue.
-- KEYS[1] the in-flight hash, KEYS[2] the queue's in-flight order (zset), KEYS[3] the stats hash
-- (field 'enqueued': the last number given)
-- ARGV[1] RQ job id, ARGV[2] the in-flight record (JSON)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], redis.call('HINCRBY', KEYS[3], 'enqueued', 1), ARGV[1])
return 1
