-- due.lua: release the deliveries whose time has come (a campaign sent at each recipient's
-- local hour) from the partition's due set into its stream, oldest first, so consumers can
-- claim them. Run by every instance's reclaimer; ZREM decides, so a delivery is released once.
--
-- KEYS[1] due set, KEYS[2] stream
-- ARGV[1] now in ms (0: Redis's clock; tests pass a fake one), ARGV[2] most to release
-- Returns how many were released.
arity(2, 0, 2, 0)
local now = tonumber(ARGV[1])
if now == 0 then
  now = now_ms()
end
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do
  if redis.call('ZREM', KEYS[1], id) == 1 then
    redis.call('XADD', KEYS[2], '*', 'delivery', id)
  end
end
return #ids
