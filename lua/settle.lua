-- settle.lua: record the final outcome of each member of a sealed batch, then delete the
-- batch (its body holds addresses). Idempotent: a batch already settled is left alone, and
-- only members still sealed into this batch change.
--
-- Two kinds of callers. The provider's 2xx answer for the batch's key is authoritative, so
-- anyone may record it (owner ''): a replay gives every holder the same answer. A verdict
-- without such an answer (giving up after retries, a fatal error, an expired window) needs
-- the current holder (a holder whose lease was taken over cannot overwrite), and a member
-- the batch record says may have been sent becomes outcome_unknown, never failed.
-- Failed members go to the dead-letter stream; outcome_unknown members to the unknown stream.
--
-- KEYS[1] batch, KEYS[2] batches zset, KEYS[3] dead stream, KEYS[4] unknown stream,
-- KEYS[5..4+c] counts hashes, KEYS[5+c..] delivery keys of the members
-- ARGV[1] batch id, ARGV[2] c (number of counts keys), ARGV[3] retention ms, ARGV[4] owner or '';
--   then per member: delivery id, state, detail (provider id or error name), counts index (1-based)
-- Returns, per member, the state recorded now ('' where nothing changed).
local bid, c, retention, owner = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local out = {}
local b = redis.call('HMGET', KEYS[1], 'owner', 'maybe_sent')
if not b[1] or (owner ~= '' and b[1] ~= owner) then
  for i = 5 + c, #KEYS do out[#out + 1] = '' end
  return out
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
for i = 5 + c, #KEYS do
  local base = 4 + 4 * (i - 5 - c)
  local id, state, detail, ci = ARGV[base + 1], ARGV[base + 2], ARGV[base + 3], tonumber(ARGV[base + 4])
  if state == 'failed' and owner ~= '' and b[2] == '1' then
    state = 'outcome_unknown'
  end
  local d = redis.call('HMGET', KEYS[i], 'state', 'batch', 'attempts')
  if d[1] == 'sealed' and d[2] == bid then
    local field = 'error'
    if state == 'sent' then field = 'provider_id' end
    redis.call('HSET', KEYS[i], 'state', state, field, detail, 'settled_ms', now)
    redis.call('HINCRBY', KEYS[4 + ci], state, 1)
    redis.call('EXPIRE', KEYS[4 + ci], math.floor(retention / 1000), 'NX')
    if state == 'failed' then
      redis.call('XADD', KEYS[3], 'MINID', '~', now - retention, '*',
        'delivery', id, 'error', detail, 'attempts', d[3] or 0)
    elseif state == 'outcome_unknown' then
      redis.call('XADD', KEYS[4], 'MINID', '~', now - retention, '*',
        'delivery', id, 'error', detail, 'attempts', d[3] or 0)
    end
    out[#out + 1] = state
  else
    out[#out + 1] = ''
  end
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], bid)
return out
