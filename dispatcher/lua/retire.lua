-- requires: session_document_lib
-- A session closed: copy its raw document to the archive, then schedule its expiry.
-- (session_document_lib.lua is prepended: session_document.)
-- KEYS[1] meta hash ({S})
-- KEYS[2] messages hash ({S})
-- KEYS[3] events stream ({S})
-- KEYS[4] the archive stream
-- KEYS[5] the expiring sorted set (session -> end of retention, Unix ms)
-- KEYS[6] the idle sorted set (a closed session is never idle)
-- ARGV[1] the session id
-- ARGV[2] closed_at (Unix ms)
-- ARGV[3] expires_at (Unix ms)
-- ARGV[4] archive MAXLEN (approximate trim); 0 = no archive
-- Run inside the outbox flush's MULTI with the outbox deletion: after a crash before its EXEC
-- the flush is done again, so an archive entry may be written twice (consumers upsert by
-- session); the ZADD is the same either way.
if tonumber(ARGV[4]) > 0 then
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[4], '*', 'session', ARGV[1], 'closed_at', ARGV[2],
             'document', session_document(KEYS[1], KEYS[2], KEYS[3], ARGV[1]))
end
redis.call('ZADD', KEYS[5], ARGV[3], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
return 1
