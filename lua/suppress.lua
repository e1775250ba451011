-- suppress.lua: an address's suppression, in the address's home partition (its key names
-- carry a salted hash, never the address). A webhook event has its effect here once: the
-- event id is recorded with SET NX and a TTL in the same step. Returns the ids of the
-- subscribers who have this address (from the address index), whether or not the effect
-- was new, so a retried event can finish its cascade.
--
-- KEYS[1] seen key, KEYS[2] suppression hash, KEYS[3] transient-bounce zset, KEYS[4] address index
-- ARGV[1] mode: 'suppress' (permanent bounce, complaint, provider suppression, operator),
--   'transient' (a transient or undetermined bounce: counted), 'remove' (operator lifts it),
--   'provider_remove' (Resend took it off its own list: lifted only when the suppression is
--   Resend's, reason 'provider_suppressed'; an operator's, a bounce's or a complaint's stays)
-- ARGV[2] reason, ARGV[3] source ('webhook' | 'operator' | 'provider'), ARGV[4] event id ('' for
--   an operator or a sync),
-- ARGV[5] seen TTL s, ARGV[6] transient window ms, ARGV[7] transient bounces that suppress
-- Returns {state, subscriber ids...}: state 'new' (suppressed now), 'already' (it was),
-- 'counted' (a transient bounce below the threshold), 'removed', 'kept' (provider_remove of a
-- suppression that is not Resend's, or of none), 'duplicate' (event seen).
arity(4, 0, 7, 0)
local mode, reason, source, event = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local ttl, window, threshold = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local now = now_ms()
local ids = redis.call('SMEMBERS', KEYS[4])
local state
if event ~= '' and not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ttl) then
  state = 'duplicate'
elseif mode == 'remove' then
  redis.call('DEL', KEYS[2], KEYS[3])
  state = 'removed'
elseif mode == 'provider_remove' then
  if redis.call('HGET', KEYS[2], 'reason') == 'provider_suppressed' then
    redis.call('DEL', KEYS[2], KEYS[3])
    state = 'removed'
  else
    state = 'kept'
  end
elseif redis.call('EXISTS', KEYS[2]) == 1 then
  state = 'already'
else
  local suppress = mode == 'suppress'
  if mode == 'transient' then
    redis.call('ZADD', KEYS[3], now, event)
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - window)
    redis.call('PEXPIRE', KEYS[3], window)
    suppress = redis.call('ZCARD', KEYS[3]) >= threshold
  end
  if suppress then
    redis.call('HSET', KEYS[2], 'reason', reason, 'at_ms', now, 'source', source, 'event', event)
    state = 'new'
  else
    state = 'counted'
  end
end
local out = {state}
for _, id in ipairs(ids) do out[#out + 1] = id end
return out
