-- enqueue.lua: enqueue deliveries of one partition and one campaign period, each at most once.
-- A delivery's record is named by its natural dedup key (campaign:period:subscriber:target),
-- so HSETNX on it is the dedup check, and the record and its stream entry are written in this
-- one atomic step: a double kick, a retried kick or two daemons kicking at once enqueue once.
-- The record has no expiry until it is settled (nothing expires while unsettled).
--
-- KEYS[1] stream, KEYS[2] counts hash; then per item KEYS[2+i] delivery key
-- ARGV[1] retention seconds (for the counts hash); then per item: delivery id
-- Returns one integer per item: 1 if it was enqueued now, 0 if it already was.
local retention = tonumber(ARGV[1])
local result, added = {}, 0
for i = 3, #KEYS do
  if redis.call('HSETNX', KEYS[i], 'state', 'pending') == 1 then
    redis.call('XADD', KEYS[1], '*', 'delivery', ARGV[i - 1])
    added = added + 1
    result[#result + 1] = 1
  else
    result[#result + 1] = 0
  end
end
if added > 0 then
  redis.call('HINCRBY', KEYS[2], 'enqueued', added)
  redis.call('EXPIRE', KEYS[2], retention)
end
return result
