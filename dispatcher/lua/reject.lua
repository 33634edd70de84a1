-- Report a rejected entry on its session: the `input.refused` event, and the idempotency key
-- it uses up (if any). A session that does not exist gets these keys for a short while only:
-- a flood of bad entries naming made-up sessions leaves nothing behind (docs/protocol.md).
-- KEYS[1] the session's meta hash (read only: does it have a core?)
-- KEYS[2] its events stream
-- KEYS[3] its used idempotency keys (sorted set)
-- ARGV[1] the event JSON, ARGV[2] events MAXLEN (approximate trim)
-- ARGV[3] the idempotency key ('' = none), ARGV[4] until when it counts (Unix ms), ARGV[5] now
-- ARGV[6] ms the keys of a session that does not exist live
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'event', ARGV[1])
if ARGV[3] ~= '' then
  redis.call('ZADD', KEYS[3], ARGV[4], ARGV[3])
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[5])
end
if redis.call('HEXISTS', KEYS[1], 'core') == 0 then
  redis.call('PEXPIRE', KEYS[2], ARGV[6])
  redis.call('PEXPIRE', KEYS[3], ARGV[6])
end
return 1
