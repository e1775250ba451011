-- release.lua: hand back deliveries this owner claimed but will not seal (a graceful stop, a
-- quota pause, a full queue): pending again, the claim not counted, and a fresh stream entry
-- in place of the old one, so any instance reads them at once instead of after the lease.
--
-- KEYS[1] stream, KEYS[2..] delivery keys
-- ARGV[1] group, ARGV[2] owner; then per delivery: stream entry id, delivery id
-- Returns how many were released.
local group, owner = ARGV[1], ARGV[2]
local released = 0
for i = 2, #KEYS do
  local entry, id = ARGV[1 + 2 * (i - 1)], ARGV[2 + 2 * (i - 1)]
  local d = redis.call('HMGET', KEYS[i], 'state', 'lease_owner')
  if d[1] == 'processing' and d[2] == owner then
    redis.call('HSET', KEYS[i], 'state', 'pending')
    redis.call('HDEL', KEYS[i], 'lease_owner', 'lease_until')
    redis.call('HINCRBY', KEYS[i], 'claims', -1)
    redis.call('XACK', KEYS[1], group, entry)
    redis.call('XADD', KEYS[1], '*', 'delivery', id)
    released = released + 1
  end
end
return released
