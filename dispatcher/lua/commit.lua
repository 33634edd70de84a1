-- requires: inflight_lib
-- Commit one transition of one session, atomically, or nothing.
-- KEYS[1] meta hash ({S}: ver, core, applied)
-- KEYS[2] messages hash ({S})
-- KEYS[3] events stream ({S})
-- KEYS[4] outbox hash ({S})
-- KEYS[5] the session's used idempotency keys ({S}: sorted set, key -> until, Unix ms)
-- KEYS[6] the partition's lease (fencing; ignored when ARGV[2] is empty).
-- KEYS[7] the fleet-wide feed stream.
-- KEYS[8] RQ's set of queue keys (rq:queues), KEYS[9] the in-flight hash (parley:inflight)
-- then    4 keys per job enqueued: its RQ job hash, its queue (list), the queue's in-flight
--         order (zset), its token key (string)
--         KEYS[6] and on are outside the session's slot: Redis Cluster is not supported yet.
-- KEYS[#KEYS] (last, after the jobs') the session's partition's list of sessions (Keys.partition_sessions)
-- ARGV[1] expected version (what the transition was computed from)
-- ARGV[2] lease token held by the committing dispatcher, or ''
-- ARGV[3] core JSON ('' = the session still does not exist)
-- ARGV[4] applied-markers JSON
-- ARGV[5] events MAXLEN (approximate trim)
-- ARGV[6] the input's idempotency key ('' = none)
-- ARGV[7] feed MAXLEN (approximate trim)
-- ARGV[8] the session id (named by feed entries)
-- ARGV[9] until when the key counts (Unix ms)
-- ARGV[10] now (Unix ms): keys counting until before it are dropped
-- ARGV[11] the session's message count, ARGV[12] its branch count (the meta hash's `n_msgs`,
--          `n_branches`, read by the submit function; written with the core)
-- ARGV[13] ms the keys of a session that does not exist live (ARGV[3] == ''): an input naming
--          no session leaves its refusal readable that long, then nothing
-- ARGV[14] '1' when this transition creates the session: its keys are kept for good again
-- ARGV[15] n messages, then n pairs (id, json)
-- then    t fields of the tree's shape, then t pairs (meta hash field `tree:<k>`, json):
--         the chunks the new messages fall in (schemas/tree.py)
-- then    m events, then m pairs (feed type or '' when the event stays in the session, json)
-- then    k effects, then k pairs (seq, json): the outbox's, for the settle
-- then    q jobs, then per job: its id, its in-flight record (JSON), its token, f, then f pairs
--         (field, value) of its RQ job hash (as RQ's enqueue writes it; dispatcher/enqueue.py)
-- Returns 1 committed, 0 version conflict (reload and retry), -1 lease lost (stop).
-- Nothing is written before both checks pass, so a refused commit (a replay computed from an
-- old version included) leaves the feed as it was: each applied event is copied once.
if ARGV[2] ~= '' and redis.call('GET', KEYS[6]) ~= ARGV[2] then
  return -1
end
local ver = redis.call('HGET', KEYS[1], 'ver') or '0'
if ver ~= ARGV[1] then
  return 0
end
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'ver', tonumber(ver) + 1, 'core', ARGV[3], 'applied', ARGV[4],
             'n_msgs', ARGV[11], 'n_branches', ARGV[12])
else
  redis.call('HSET', KEYS[1], 'ver', tonumber(ver) + 1, 'applied', ARGV[4])
end
if ARGV[6] ~= '' then
  redis.call('ZADD', KEYS[5], ARGV[9], ARGV[6])
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', ARGV[10])
end
local i = 15
local n = tonumber(ARGV[i])
for j = 1, n do
  redis.call('HSET', KEYS[2], ARGV[i + 2 * j - 1], ARGV[i + 2 * j])
end
i = i + 2 * n + 1
local t = tonumber(ARGV[i])
for j = 1, t do
  redis.call('HSET', KEYS[1], ARGV[i + 2 * j - 1], ARGV[i + 2 * j])
end
i = i + 2 * t + 1
local m = tonumber(ARGV[i])
for j = 1, m do
  local feed_type, event = ARGV[i + 2 * j - 1], ARGV[i + 2 * j]
  local id = redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[5], '*', 'event', event)
  if feed_type ~= '' then
    redis.call('XADD', KEYS[7], 'MAXLEN', '~', ARGV[7], '*', 'session', ARGV[8], 'type', feed_type,
               'event_id', id, 'event', event)
  end
end
i = i + 2 * m + 1
local k = tonumber(ARGV[i])
for j = 1, k do
  redis.call('HSET', KEYS[4], ARGV[i + 2 * j - 1], ARGV[i + 2 * j])
end
-- The transition's jobs, enqueued here rather than by the settle: a job exists iff its
-- transition committed, so a replay of the entry (already applied) enqueues nothing again
-- (docs/design.md, "The enqueue path and the outbox"). Per job what RQ's enqueue writes
-- (SADD rq:queues, the job hash, RPUSH), then its in-flight record, numbered in the queue's
-- order (inflight_lib.lua).
i = i + 2 * k + 1
local q = tonumber(ARGV[i])
-- how long a job's token waits for its take: dispatcher/enqueue.py JOB_TOKEN_TTL_MS
local TOKEN_TTL_MS = 604800000
for j = 1, q do
  local job, queue, order = KEYS[6 + 4 * j], KEYS[7 + 4 * j], KEYS[8 + 4 * j]
  local token_key = KEYS[9 + 4 * j]
  local id, record, token, f = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], tonumber(ARGV[i + 4])
  redis.call('SADD', KEYS[8], queue)
  redis.call('HSET', job, unpack(ARGV, i + 5, i + 4 + 2 * f))
  redis.call('RPUSH', queue, id)
  record_inflight(KEYS[9], order, id, record)  -- inflight_lib.lua, prepended
  -- the job's token, for the take that claims it alone (schemas/signing.py job_token)
  redis.call('SET', token_key, token, 'PX', TOKEN_TTL_MS)
  i = i + 4 + 2 * f
end
-- The session in its partition's list (a move finds the partition's sessions there, not by
-- scanning the shard), by the transition that creates it: once, not on every commit. Sessions
-- of an older release are listed by `parley partitions index`, and a move adds any its list
-- lacks before its freeze (parley/fleet/moves.py check_listed).
if ARGV[14] == '1' then
  redis.call('ZADD', KEYS[#KEYS], 0, ARGV[8])
end
-- Last, so the keys this commit wrote are covered: meta, messages, events, outbox, used keys.
if ARGV[3] == '' then
  for _, key in ipairs({KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]}) do
    redis.call('PEXPIRE', key, ARGV[13])
  end
elseif ARGV[14] == '1' then
  for _, key in ipairs({KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]}) do
    redis.call('PERSIST', key)
  end
end
return 1
