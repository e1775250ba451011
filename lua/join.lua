-- join.lua: the steps of a shared tail request that touch one batch each. At the end of a
-- run every partition holds its last partial batch; rather than one request each, one
-- request carries several partitions' batches. Each batch stays sealed in its own slot; the
-- lead (the first) names its riders (`riders`, at sealing), each rider names its lead
-- (`lead`). The riders pass their last gate first, then the lead's gate composes the request
-- from its own members and the riders' bodies and stores it (`joint_key`, `joint_body`,
-- `joint_parts`) in the same step that marks it 'sending': that is the commit. Before it the
-- shared request never left, so it can be dissolved into batches of their own; once it may
-- have left, it is only ever resent whole, by whoever holds the lead (adopting the riders),
-- and settled riders first, lead last.
-- A rider never sends on its own while it has a lead. The riders are sealed before their lead,
-- so a rider whose lead does not exist and which never passed its gate cannot have been sent.
-- A committed request known not to have left (put back, refused with nothing processed, or
-- looked at again before it leaves) is never gated again as it was committed: its holder
-- uncommits it first (so a rider dropping a member cannot leave a stale body behind), and a
-- taker dissolves it.
--
-- KEYS[1] the batch, KEYS[2] its partition's batches zset; ARGV[1] op, ARGV[2] batch id
-- 'wait' (a rider whose lead decides): ARGV[3] lead, ARGV[4] lease ms. Pushes the rider's
--   due time a lease on while it still has that lead. Returns 1, or 0 if it has not.
-- 'unjoin' (a rider leaves: its lead never committed it): ARGV[3] lead, ARGV[4] owner,
--   ARGV[5] lease ms, ARGV[6] mode: 'sealed' (only if it never passed its gate), 'any', or
--   'lost' (its lead is gone while it may have been carried: held as maybe sent and sealed
--   before any idempotency window, so that neither the gate nor a taker ever resends it: it
--   can only be settled outcome_unknown). Returns {'ok', key, body, members, tries}, {'sending'} (mode 'sealed'
--   and it passed its gate) or {'no'} (it has no such lead).
-- 'adopt' (the lead's taker takes its committed riders): ARGV[3] lead, ARGV[4] owner,
--   ARGV[5] lease ms, ARGV[6] '1' if the shared request may have been sent. Returns
--   {'joined', body, members}, {'unjoined'} or {'gone'} (settled).
-- 'uncommit' (a lead about to be gated again, known not sent): ARGV[3] owner. Drops the
--   stored request and marks it 'sealed'. Returns 1, or 0 if not held by that owner or maybe sent.
-- 'dissolve' (a lead whose request never left goes alone; its riders were unjoined first):
--   ARGV[3] owner. Returns {key, body}, its own, to send alone, or 0 if not held by that
--   owner or maybe sent.
local op, bid = ARGV[1], ARGV[2]
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if op == 'wait' then
  if redis.call('HGET', KEYS[1], 'lead') ~= ARGV[3] then
    return 0
  end
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[4]), bid)
  return 1
elseif op == 'unjoin' then
  local b = redis.call('HMGET', KEYS[1], 'lead', 'state', 'key', 'body', 'members', 'tries')
  if b[1] ~= ARGV[3] then
    return {'no'}
  end
  local mode = ARGV[6]
  if mode == 'sealed' and b[2] == 'sending' then
    return {'sending'}
  end
  redis.call('HDEL', KEYS[1], 'lead')
  redis.call('HSET', KEYS[1], 'owner', ARGV[4], 'state', 'sealed')
  if mode == 'lost' then
    redis.call('HSET', KEYS[1], 'maybe_sent', 1, 'sealed_ms', 0)
  end
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[5]), bid)
  return {'ok', b[3], b[4], b[5], b[6] or '0'}
elseif op == 'adopt' then
  local b = redis.call('HMGET', KEYS[1], 'lead', 'body', 'members')
  if not b[2] then
    return {'gone'}
  end
  if b[1] ~= ARGV[3] then
    return {'unjoined'}
  end
  redis.call('HSET', KEYS[1], 'owner', ARGV[4])
  if ARGV[6] == '1' then
    redis.call('HSET', KEYS[1], 'maybe_sent', 1)
  end
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[5]), bid)
  return {'joined', b[2], b[3]}
elseif op == 'uncommit' or op == 'dissolve' then
  local b = redis.call('HMGET', KEYS[1], 'owner', 'maybe_sent', 'state', 'key', 'body')
  if b[1] ~= ARGV[3] or b[2] == '1' then
    return 0
  end
  -- (HDEL of absent fields writes nothing: a lead before its first commit costs no fsync.)
  redis.call('HDEL', KEYS[1], 'joint_key', 'joint_body', 'joint_parts')
  if op == 'dissolve' then
    redis.call('HDEL', KEYS[1], 'riders')
    return {b[4], b[5]}
  end
  if b[3] == 'sending' then
    redis.call('HSET', KEYS[1], 'state', 'sealed')
  end
  return 1
end
return redis.error_reply('join.lua: unknown op ' .. tostring(op))
