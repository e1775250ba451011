-- event.lua: a provider event about one delivery (delivered, opened, bounced, ...) is written
-- on its record once: the event id is recorded with SET NX and a TTL in the same step, so ten
-- deliveries of one event change it once. An expired or unknown delivery is left alone.
--
-- Each event written is also counted by type in the hour's tally of its partition (for the
-- admin overview's last 24 hours), which expires after a day and an hour (set once, by the
-- hour's first event: NX, so no other event writes it again, to memory or to the AOF).
--
-- KEYS[1] seen key, KEYS[2] delivery record, KEYS[3] the hour's webhook tally
-- ARGV[1] event type (e.g. delivered), ARGV[2] seen TTL s
-- Returns 1 when written now, 0 for a repeat, -1 when there is no such delivery.
if redis.call('EXISTS', KEYS[2]) == 0 then
  return -1
end
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', tonumber(ARGV[2])) then
  return 0
end
local now = now_ms()
redis.call('HSET', KEYS[2], 'ev_' .. ARGV[1], now)
redis.call('HINCRBY', KEYS[2], 'events', 1)
redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
redis.call('EXPIRE', KEYS[3], 90000, 'NX')
return 1
