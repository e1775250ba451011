-- defer.lua: put off claimed deliveries whose render hook gave no answer (down, slow,
-- garbage, or an item left out): pending again in the partition's due set, released by
-- the reclaimer after a backoff that doubles with each wait, the claim not counted (a hook
-- that is down must not turn into too_many_attempts). Only deliveries this owner holds are
-- touched; their stream entries are acknowledged (due.lua adds a fresh one). Past the
-- delivery deadline (counted from the first wait) a delivery is not deferred again: the
-- caller fails it.
--
-- KEYS[1] stream, KEYS[2] due set; KEYS[2+i] delivery keys
-- ARGV[1] group, ARGV[2] owner, ARGV[3] base ms, ARGV[4] max ms, ARGV[5] deadline ms,
--   ARGV[6] jitter percent (0-100, drawn by the caller); then per item: entry id, delivery id
-- Returns per item the delay in ms, -1 if not held by this owner, -2 if past the deadline.
local n = arity(2, 1, 6, 2)
-- Item m's key and arguments.
local function member(m)
  return {dkey = KEYS[2 + m], entry = ARGV[5 + 2 * m], id = ARGV[6 + 2 * m]}
end
local group, owner = ARGV[1], ARGV[2]
local base, max, deadline, jitter = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local now = now_ms()
local out = {}
for m = 1, n do
  local mb = member(m)
  local dkey = mb.dkey
  local d = hmget(dkey, 'state', 'lease_owner', 'hook_wait_since')
  if d.state ~= 'processing' or d.lease_owner ~= owner then
    out[#out + 1] = -1
  elseif d.hook_wait_since and now - tonumber(d.hook_wait_since) > deadline then
    out[#out + 1] = -2
  else
    local waits = redis.call('HINCRBY', dkey, 'hook_waits', 1)
    redis.call('HSETNX', dkey, 'hook_wait_since', now)
    local delay = math.min(base * 2 ^ math.min(waits - 1, 30), max)
    delay = math.floor(delay * (100 - jitter / 2) / 100)
    redis.call('HSET', dkey, 'state', 'pending', 'release_ms', now + delay)
    redis.call('HDEL', dkey, 'lease_owner', 'lease_until')
    redis.call('HINCRBY', dkey, 'claims', -1)
    redis.call('ZADD', KEYS[2], now + delay, mb.id)
    redis.call('XACK', KEYS[1], group, mb.entry)
    out[#out + 1] = delay
  end
end
return out
