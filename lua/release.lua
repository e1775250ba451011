-- release.lua: hand back deliveries this owner claimed but will not seal (a graceful stop, a
-- quota pause, a full queue): pending again, the claim not counted, and a fresh stream entry
-- in place of the old one, so any instance reads them at once instead of after the lease.
--
-- KEYS[1] stream, KEYS[2..] delivery keys
-- ARGV[1] group, ARGV[2] owner; then per delivery: stream entry id, delivery id
-- Returns how many were released.
local n = arity(1, 1, 2, 2)
-- Delivery m's key and arguments.
local function member(m)
  return {dkey = KEYS[1 + m], entry = ARGV[1 + 2 * m], id = ARGV[2 + 2 * m]}
end
local group, owner = ARGV[1], ARGV[2]
local released = 0
for m = 1, n do
  local mb = member(m)
  local d = hmget(mb.dkey, 'state', 'lease_owner')
  if d.state == 'processing' and d.lease_owner == owner then
    redis.call('HSET', mb.dkey, 'state', 'pending')
    redis.call('HDEL', mb.dkey, 'lease_owner', 'lease_until')
    redis.call('HINCRBY', mb.dkey, 'claims', -1)
    redis.call('XACK', KEYS[1], group, mb.entry)
    redis.call('XADD', KEYS[1], '*', 'delivery', mb.id)
    released = released + 1
  end
end
return released
