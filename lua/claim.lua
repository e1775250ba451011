-- claim.lua: move deliveries pending -> processing under a lease (owner + expiry).
-- A delivery whose lease expired (its holder died) is taken over; one held under a live
-- lease is left alone, so whoever lost a race does nothing.
--
-- KEYS: delivery keys. ARGV[1] owner, ARGV[2] lease milliseconds.
-- Returns per delivery one of:
--   {'claimed', claims}   ours now; claims counts this claim too
--   {'held'}              another holder's lease is live: do nothing
--   {'gone'}              no record, and none kept compactly (a lost write): the caller
--                         records it as lost
--   {state}               already sealed into a batch, or settled (with or without its record)
local n = arity(0, 1, 2, 0)
-- Delivery m's key.
local function member(m)
  return {dkey = KEYS[m]}
end
local owner, lease = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
local out = {}
for i = 1, n do
  local key = member(i).dkey
  local d = hmget(key, 'state', 'lease_until')
  local state = d.state
  if not state then
    -- Settled compactly (its record is gone by design), or lost.
    out[i] = {compacted(key) or 'gone'}
  elseif state == 'pending' or (state == 'processing' and tonumber(d.lease_until or 0) <= now) then
    local claims = redis.call('HINCRBY', key, 'claims', 1)
    redis.call('HSET', key, 'state', 'processing', 'lease_owner', owner, 'lease_until', now + lease)
    out[i] = {'claimed', tostring(claims)}
  elseif state == 'processing' then
    out[i] = {'held'}
  else
    out[i] = {state}
  end
end
return out
