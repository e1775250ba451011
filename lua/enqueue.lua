-- enqueue.lua: enqueue deliveries of one partition and one campaign period, each at most once.
-- The dedup key (SET NX), the delivery record and the stream entry are written in this one
-- atomic step, so a double kick, a retried kick or two daemons kicking at once enqueue once.
--
-- KEYS[1] stream, KEYS[2] counts hash; then per item i: KEYS[1+2i] dedup key, KEYS[2+2i] delivery key
-- ARGV[1] retention seconds, ARGV[2] campaign, ARGV[3] period;
--   then per item: delivery id, subscriber id, target id
-- Returns one integer per item: 1 if it was enqueued now, 0 if it already was.
local retention = tonumber(ARGV[1])
local campaign, period = ARGV[2], ARGV[3]
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local result, added = {}, 0
for i = 1, (#KEYS - 2) / 2 do
  local id, subscriber, target = ARGV[1 + 3 * i], ARGV[2 + 3 * i], ARGV[3 + 3 * i]
  local dedup, delivery = KEYS[1 + 2 * i], KEYS[2 + 2 * i]
  if redis.call('SET', dedup, id, 'NX', 'EX', retention) then
    redis.call('HSET', delivery, 'campaign', campaign, 'period', period, 'subscriber', subscriber,
      'target', target, 'state', 'pending', 'attempts', 0, 'created_ms', now)
    redis.call('EXPIRE', delivery, retention)
    redis.call('XADD', KEYS[1], '*', 'delivery', id)
    result[i] = 1
    added = added + 1
  else
    result[i] = 0
  end
end
if added > 0 then
  redis.call('HINCRBY', KEYS[2], 'enqueued', added)
  redis.call('EXPIRE', KEYS[2], retention)
end
return result
