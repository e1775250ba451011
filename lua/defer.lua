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
local group, owner = ARGV[1], ARGV[2]
local base, max, deadline, jitter = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local now = now_ms()
local out = {}
for i = 3, #KEYS do
  local entry, id = ARGV[7 + 2 * (i - 3)], ARGV[8 + 2 * (i - 3)]
  local d = redis.call('HMGET', KEYS[i], 'state', 'lease_owner', 'hook_wait_since')
  if d[1] ~= 'processing' or d[2] ~= owner then
    out[#out + 1] = -1
  elseif d[3] and now - tonumber(d[3]) > deadline then
    out[#out + 1] = -2
  else
    local waits = redis.call('HINCRBY', KEYS[i], 'hook_waits', 1)
    redis.call('HSETNX', KEYS[i], 'hook_wait_since', now)
    local delay = math.min(base * 2 ^ math.min(waits - 1, 30), max)
    delay = math.floor(delay * (100 - jitter / 2) / 100)
    redis.call('HSET', KEYS[i], 'state', 'pending', 'release_ms', now + delay)
    redis.call('HDEL', KEYS[i], 'lease_owner', 'lease_until')
    redis.call('HINCRBY', KEYS[i], 'claims', -1)
    redis.call('ZADD', KEYS[2], now + delay, id)
    redis.call('XACK', KEYS[1], group, entry)
    out[#out + 1] = delay
  end
end
return out
