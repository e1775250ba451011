-- renew.lua: a live holder's heartbeat. Extends the leases of the deliveries it has claimed
-- (waiting in its queues) and of the sealed batches it holds (waiting for a slot or on the
-- wire), in Redis time, so leases can be short and only a dead or stalled holder loses work.
--
-- KEYS[1] batches zset, then n delivery keys, then batch keys
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] n; then per batch key its batch id
-- Returns {deliveries renewed, batches renewed}.
local n = tonumber(ARGV[3]) or -1
local held = arity(1 + n, 1, 3, 1)
-- Held batch m's record and id.
local function member(m)
  return {bkey = KEYS[1 + n + m], id = ARGV[3 + m]}
end
local owner, lease = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
local claims, batches = 0, 0
for i = 2, 1 + n do
  local d = hmget(KEYS[i], 'state', 'lease_owner')
  if d.state == 'processing' and d.lease_owner == owner then
    redis.call('HSET', KEYS[i], 'lease_until', now + lease)
    claims = claims + 1
  end
end
for m = 1, held do
  local mb = member(m)
  local bid = mb.id
  local b = hmget(mb.bkey, 'owner', 'state')
  if b.owner == owner and (b.state == 'sealed' or b.state == 'sending') then
    redis.call('ZADD', KEYS[1], 'GT', now + lease, bid)
    batches = batches + 1
  end
end
return {claims, batches}
