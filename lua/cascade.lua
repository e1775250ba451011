-- cascade.lua: a suppression reaches the subscribers who have the address, in one of their
-- partitions: each is marked suppressed (the reason) and unsubscribed, and leaves the
-- partition's audience, so neither the kick nor the last gate sends to them. Lifting it
-- clears the mark (not the unsubscribe: that is the application's or the subscriber's to
-- undo). For a webhook event this is done once per
-- partition (SET NX on the event's seen key in the same step).
--
-- KEYS[1] seen key (ignored without an event), KEYS[2] audience hash, KEYS[3..] subscriber
-- records
-- ARGV[1] mode ('suppress' | 'remove'), ARGV[2] reason, ARGV[3] event id ('' for an
-- operator), ARGV[4] seen TTL s, ARGV[5..] the subscribers' ids (as KEYS[3..])
-- Returns how many subscribers changed (-1: the event was already applied here).
local mode, reason, event, ttl = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
if event ~= '' and not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ttl) then
  return -1
end
local changed = 0
for i = 3, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    if mode == 'suppress' then
      redis.call('HSET', KEYS[i], 'suppressed', reason, 'subscribed', '0')
      redis.call('HDEL', KEYS[2], ARGV[i + 2])
    else
      redis.call('HDEL', KEYS[i], 'suppressed')
    end
    changed = changed + 1
  end
end
return changed
