-- cascade.lua: a suppression reaches one partition. The address's hash goes into (or, when
-- lifted, out of) the partition's `suppressed` hash, which the last gate reads for every
-- address in a sealed body, whoever supplied it; and the subscribers of this partition who
-- have the address are marked suppressed (the reason) and unsubscribed, and leave the
-- partition's audience, so the kick does not enqueue them. Lifting it clears the mark (not
-- the unsubscribe: that is the application's or the subscriber's to undo). Run in every
-- partition; for a webhook event, once per partition (SET NX on the event's seen key in the
-- same step).
--
-- KEYS[1] seen key (ignored without an event), KEYS[2] audience hash, KEYS[3] suppressed
-- addresses hash, KEYS[4..] subscriber records
-- ARGV[1] mode ('suppress' | 'remove'), ARGV[2] reason, ARGV[3] event id ('' for an
-- operator), ARGV[4] seen TTL s, ARGV[5] address hash, ARGV[6..] the subscribers' ids (as KEYS[4..])
-- Returns how many subscribers changed (-1: the event was already applied here).
local n = arity(3, 1, 5, 1)
-- Subscriber m's record and id.
local function member(m)
  return {skey = KEYS[3 + m], id = ARGV[5 + m]}
end
local mode, reason, event, ttl, hash = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
if event ~= '' and not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ttl) then
  return -1
end
if mode == 'suppress' then
  redis.call('HSET', KEYS[3], hash, reason)
else
  redis.call('HDEL', KEYS[3], hash)
end
local changed = 0
for m = 1, n do
  local mb = member(m)
  local skey, id = mb.skey, mb.id
  if redis.call('EXISTS', skey) == 1 then
    if mode == 'suppress' then
      redis.call('HSET', skey, 'suppressed', reason, 'subscribed', '0')
      redis.call('HDEL', KEYS[2], id)
    else
      redis.call('HDEL', skey, 'suppressed')
    end
    changed = changed + 1
  end
end
return changed
