-- List one session in the list of sessions' sets (parley sessions --rebuild), only if its record
-- is still the one the entries were computed from: a transition committed in between has its
-- own Listing effect, and the rebuild reads the session again.
-- KEYS[1] the session's meta hash, KEYS[2..] the sorted sets it is listed in
-- ARGV[1] the record's version (`ver`) the entries were computed from, ARGV[2] the member
-- Returns 1 when listed, 0 when the record changed (or is gone).
if redis.call('HGET', KEYS[1], 'ver') ~= ARGV[1] then
  return 0
end
for i = 2, #KEYS do
  redis.call('ZADD', KEYS[i], 0, ARGV[2])
end
return 1
