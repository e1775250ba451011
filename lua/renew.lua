-- renew.lua: a live holder's heartbeat. Extends the leases of the deliveries it has claimed
-- (waiting in its queues) and of the sealed batches it holds (waiting for a slot or on the
-- wire), in Redis time, so leases can be short and only a dead or stalled holder loses work.
--
-- KEYS[1] batches zset, then n delivery keys, then batch keys
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] n; then per batch key its batch id
-- Returns {deliveries renewed, batches renewed}.
local owner, lease, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local claims, batches = 0, 0
for i = 2, 1 + n do
  local d = redis.call('HMGET', KEYS[i], 'state', 'lease_owner')
  if d[1] == 'processing' and d[2] == owner then
    redis.call('HSET', KEYS[i], 'lease_until', now + lease)
    claims = claims + 1
  end
end
for i = 2 + n, #KEYS do
  local bid = ARGV[3 + i - 1 - n]
  local b = redis.call('HMGET', KEYS[i], 'owner', 'state')
  if b[1] == owner and (b[2] == 'sealed' or b[2] == 'sending') then
    redis.call('ZADD', KEYS[1], 'GT', now + lease, bid)
    batches = batches + 1
  end
end
return {claims, batches}
