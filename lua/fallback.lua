-- fallback.lua: Resend refused the sender of a request of operator mail, and nothing of
-- it can have been sent (the answer was a refusal, and neither the record nor the holder
-- says an earlier request may have been processed). Seal it again, once, from the
-- template's fallback sender under a key derived from the refused one: 'sealed', held by
-- the same owner under a fresh lease, which sends it at its next slot (no backoff). One
-- step, so a crash either leaves the refused request as it was (a taker finds it
-- 'sending', takes it as maybe sent, and never falls back) or leaves the fallback sealed
-- like any new batch, sent by whoever takes it after the lease with the same key and body.
-- The members' records are marked `fallback`, for the delivery log, and the fallback is
-- counted in the period's counts hash (`fallbacks`: sealed again so, whatever came of it),
-- for the SLO report and the admin overview.
--
-- KEYS[1] batch, KEYS[2] batches zset, KEYS[3] the counts hash of its members' campaign
--   period (operator mail: one member), then per member its delivery key
-- ARGV[1] batch id, ARGV[2] owner, ARGV[3] the refused key, ARGV[4] the derived key,
--   ARGV[5] the new body, ARGV[6] its members' sizes, ARGV[7] the template,
--   ARGV[8] the refusal's error name, ARGV[9] its HTTP status, ARGV[10] lease ms,
--   ARGV[11] retention seconds (of the counts hash)
-- Returns 'sealed', or why not: 'not_held' (another holder has it, or the request the
-- answer is for is no longer the batch's), 'maybe_sent', 'again' (it is a fallback already).
local n = arity(3, 1, 11, 0)
-- Member m's delivery key.
local function member(m)
  return {dkey = KEYS[3 + m]}
end
local bid, owner = ARGV[1], ARGV[2]
local b = hmget(KEYS[1], 'owner', 'state', 'key', 'maybe_sent', 'fallback_error')
if b.owner ~= owner or b.state ~= 'sending' or b.key ~= ARGV[3] then
  return 'not_held'
end
if b.maybe_sent == '1' then
  return 'maybe_sent'
end
if b.fallback_error then
  return 'again'
end
local now = now_ms()
redis.call('HINCRBY', KEYS[1], 'tries', 1)
redis.call('HSET', KEYS[1], 'state', 'sealed', 'key', ARGV[4], 'body', ARGV[5], 'sizes', ARGV[6], 'sealed_ms', now,
  'last_error', ARGV[8], 'fallback_template', ARGV[7], 'fallback_error', ARGV[8], 'fallback_status', ARGV[9])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[10]), bid)
redis.call('HINCRBY', KEYS[3], 'fallbacks', 1)
redis.call('PEXPIREAT', KEYS[3], keep_until(KEYS[3], now, tonumber(ARGV[11])))
for m = 1, n do
  local dkey = member(m).dkey
  if redis.call('HGET', dkey, 'batch') == bid then
    redis.call('HSET', dkey, 'fallback', '1')
  end
end
return 'sealed'
