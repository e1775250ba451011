-- enqueue.lua: enqueue deliveries of one partition and one campaign period, each at most once.
-- A delivery's record is named by its natural dedup key (campaign:period:subscriber:target),
-- so HSETNX on it is the dedup check, and the record and its stream entry are written in this
-- one atomic step: a double kick, a retried kick or two daemons kicking at once enqueue once.
-- The record has no expiry until it is settled (nothing expires while unsettled). A delivery
-- due later (a campaign sent at each recipient's local hour) waits in the partition's due set,
-- scored by its release time, instead of the stream; the reclaimer releases it (due.lua). The
-- period is listed in the partition's periods index (what /metrics and `mailstream slo` report
-- on), and the counts hash keeps how many were new and how many were duplicates.
--
-- KEYS[1] stream, KEYS[2] counts hash, KEYS[3] periods index, KEYS[4] due set;
--   then per item KEYS[4+i] delivery key: the partition's delivery prefix plus the delivery id
-- ARGV[1] retention seconds, ARGV[2] `campaign:period`, ARGV[3] the prefix's length,
--   ARGV[4] '1' if a release time (ms; 0: now) follows per item as ARGV[4+i], else '0' (all now)
-- Returns one integer per item: 1 if it was enqueued now, 0 if it already was.
local retention, plen, timed = tonumber(ARGV[1]), tonumber(ARGV[3]), ARGV[4] == '1'
local now = now_ms()
local result, added = {}, 0
for i = 5, #KEYS do
  if redis.call('HSETNX', KEYS[i], 'state', 'pending') == 1 then
    local id, release = string.sub(KEYS[i], plen + 1), 0
    if timed then
      release = tonumber(ARGV[i])
    end
    if release > now then
      redis.call('HSET', KEYS[i], 'release_ms', release)
      redis.call('ZADD', KEYS[4], release, id)
    else
      redis.call('XADD', KEYS[1], '*', 'delivery', id)
    end
    added = added + 1
    result[#result + 1] = 1
  else
    result[#result + 1] = 0
  end
end
if added > 0 then
  redis.call('HINCRBY', KEYS[2], 'enqueued', added)
end
if added < #KEYS - 4 then
  redis.call('HINCRBY', KEYS[2], 'duplicates', #KEYS - 4 - added)
end
redis.call('EXPIRE', KEYS[2], retention)
-- Scored by the last enqueue; a period drops out once its counts have expired.
redis.call('ZADD', KEYS[3], now, ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - retention * 1000)
redis.call('PEXPIRE', KEYS[3], retention * 1000)
return result
