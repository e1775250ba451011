-- optout.lua: a subscriber turns one campaign off (RFC 8058 one-click unsubscribe): the field
-- `off:<campaign>` is set on their record, which the claim and the last gate read, and the id
-- joins the partition's opt-out set of the campaign, which the kick reads. Idempotent; a
-- subscriber deleted since is left deleted.
--
-- KEYS[1] subscriber record, KEYS[2] the campaign's opt-out set. ARGV[1] campaign, ARGV[2] id.
-- Returns 1 if the campaign was on until now, 0 if it was already off, -1 if no such subscriber.
arity(2, 0, 2, 0)
if redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
local now = now_ms()
redis.call('SADD', KEYS[2], ARGV[2])
return redis.call('HSETNX', KEYS[1], 'off:' .. ARGV[1], now)
