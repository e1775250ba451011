-- take.lua: take over a sealed batch that needs attention: its retry is due, or its holder's
-- lease expired. The taker resends the sealed bytes with the sealed key, so the provider
-- replays instead of sending twice. If the holder died while the request may have been on
-- the wire (state 'sending'), the batch is marked maybe-sent; one that may have been sent and
-- was sealed longer ago than the provider's idempotency window is not resent: it is marked
-- expired and its members must be settled as outcome_unknown. (The last gate checks again.)
--
-- KEYS[1] batch, KEYS[2] batches zset
-- ARGV[1] batch id, ARGV[2] owner, ARGV[3] lease ms, ARGV[4] resend window ms
-- Returns {'take', key, body, members, tries, maybe_sent}, {'expired', members},
-- {'lost'} when the zset names a batch whose record is gone, or {'skip'} when it is not due.
arity(2, 0, 4, 0)
local bid, owner = ARGV[1], ARGV[2]
local lease, window = tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
local score = redis.call('ZSCORE', KEYS[2], bid)
if not score or tonumber(score) > now then
  return {'skip'}
end
local b = hmget(KEYS[1], 'key', 'body', 'members', 'sealed_ms', 'tries', 'state', 'maybe_sent')
if not b.key then
  redis.call('ZREM', KEYS[2], bid)
  return {'lost'}
end
local maybe_sent = b.maybe_sent
if b.state == 'sending' then
  -- The holder's lease ran out while the request may have been on the wire.
  maybe_sent = '1'
end
redis.call('HSET', KEYS[1], 'owner', owner, 'maybe_sent', maybe_sent)
redis.call('ZADD', KEYS[2], now + lease, bid)
if maybe_sent == '1' and now - tonumber(b.sealed_ms) > window then
  redis.call('HSET', KEYS[1], 'state', 'expired')
  return {'expired', b.members}
end
redis.call('HSET', KEYS[1], 'state', 'sealed')
return {'take', b.key, b.body, b.members, b.tries, maybe_sent}
