-- An input found on another partition's stream, moved to its own (dispatcher/consume.py,
-- `forward_strays`): acknowledged on the stream it was read from and, only if this call is the
-- one that acknowledged it (a stalled dispatcher and the partition's new owner may both try),
-- added to its partition's stream with the same fields and deleted here. One step: the entry
-- is then on exactly one stream, once.
-- KEYS[1] the stream it was read from; KEYS[2] its partition's stream of the same name
-- ARGV[1] the consumer group; ARGV[2] the entry's id; ARGV[3..] its fields and values
-- Returns 1 when moved, 0 when another had acknowledged it already.
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) ~= 1 then
  return 0
end
redis.call('XADD', KEYS[2], '*', unpack(ARGV, 3))
redis.call('XDEL', KEYS[1], ARGV[2])
return 1
