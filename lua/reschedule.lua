-- reschedule.lua: the batch's request failed in a way worth retrying, or the batch is put
-- back unsent; keep it sealed (same body, same key) and make it due again after a delay.
-- Only the current holder may do this, so a holder whose lease was taken over cannot push
-- back the new holder's work. A failed request joins the batch's `attempts` (prelude.lua,
-- history_line), which its members recorded failed or outcome_unknown keep (settle.lua).
--
-- KEYS[1] batch, KEYS[2] batches zset
-- ARGV[1] batch id, ARGV[2] owner, ARGV[3] delay ms, ARGV[4] 1 if this was a failed request
-- (0: put back unsent), ARGV[5] 1 if the request may have been processed, ARGV[6] error name,
-- ARGV[7] what the provider said ('' for nothing; addresses masked)
-- Returns the failed requests so far, or -1 when this owner no longer holds the batch.
arity(2, 0, 7, 0)
local bid, owner = ARGV[1], ARGV[2]
local now = now_ms()
local b = hmget(KEYS[1], 'owner', 'maybe_sent', 'state', 'attempts')
if b.owner ~= owner then
  return -1
end
if ARGV[4] == '0' and b.state == 'sending' then
  -- Put back after its last gate, before its request left: the gate counted a request
  -- that was never made.
  redis.call('HINCRBY', KEYS[1], 'sends', -1)
end
local tries = redis.call('HINCRBY', KEYS[1], 'tries', tonumber(ARGV[4]))
local maybe_sent = b.maybe_sent
if ARGV[5] == '1' then
  maybe_sent = '1'
end
redis.call('HSET', KEYS[1], 'state', 'retry', 'maybe_sent', maybe_sent, 'last_error', ARGV[6])
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[1], 'attempts', kept_history(b.attempts, history_line(now, 'attempt', 'retry', ARGV[6], ARGV[7])))
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), bid)
return tries
