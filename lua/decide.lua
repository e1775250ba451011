-- decide.lua: settle claimed deliveries that will not be sent (skipped: no longer wanted at
-- send time; failed: cannot be rendered, or claimed too often) and acknowledge their stream
-- entries. Only deliveries this owner still holds change.
--
-- KEYS[1] stream, KEYS[2] dead stream, KEYS[3..2+c] counts hashes, KEYS[3+c..] delivery keys
-- ARGV[1] group, ARGV[2] owner, ARGV[3] c, ARGV[4] retention ms;
--   then per delivery: stream entry id, delivery id, state, reason, counts index (1-based)
-- Returns, per delivery, 1 if it was decided now, 0 if this owner no longer held it.
local group, owner, c, retention = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local out = {}
for i = 3 + c, #KEYS do
  local base = 4 + 5 * (i - 3 - c)
  local entry, id, state, reason, ci = ARGV[base + 1], ARGV[base + 2], ARGV[base + 3], ARGV[base + 4],
    tonumber(ARGV[base + 5])
  local d = redis.call('HMGET', KEYS[i], 'state', 'lease_owner', 'attempts')
  if d[1] == 'processing' and d[2] == owner then
    local field = 'reason'
    if state == 'failed' then field = 'error' end
    redis.call('HSET', KEYS[i], 'state', state, field, reason, 'settled_ms', now)
    redis.call('HDEL', KEYS[i], 'lease_owner', 'lease_until')
    redis.call('HINCRBY', KEYS[2 + ci], state, 1)
    redis.call('EXPIRE', KEYS[2 + ci], math.floor(retention / 1000), 'NX')
    if state == 'failed' then
      redis.call('XADD', KEYS[2], 'MINID', '~', now - retention, '*',
        'delivery', id, 'error', reason, 'attempts', d[3] or 0)
    end
    redis.call('XACK', KEYS[1], group, entry)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
