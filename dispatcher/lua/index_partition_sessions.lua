-- Sessions of an older release into their partitions' lists (`parley partitions index`):
-- each only if it exists (its meta holds a core), checked and added in one step, so a session
-- the expiry sweep deletes meanwhile is never listed after it is gone.
-- KEYS pairs: the session's meta hash, its partition's list of sessions (Keys.partition_sessions)
-- ARGV the sessions, in the order of the pairs
-- Returns how many were added (0 for those already listed).
local added = 0
for i = 1, #ARGV do
  if redis.call('HEXISTS', KEYS[2 * i - 1], 'core') == 1 then
    added = added + redis.call('ZADD', KEYS[2 * i], 0, ARGV[i])
  end
end
return added
