-- ingest.lua: enqueue transactional deliveries of one partition, each at most once per
-- caller idempotency key. The key's guard (SET NX, expiring after the retention) names the
-- delivery it made and a hash of the request: a replay of the same request is a duplicate
-- (the same delivery, whenever it comes within the retention), the same key with a different
-- request is refused, as Resend refuses it (409). The delivery record keeps the request
-- (recipient, content, data): the only place an address given inline is kept; the stream
-- entry carries the id only. Recorded, written to the transactional stream and counted in
-- one atomic step.
--
-- KEYS[1] transactional stream, KEYS[2] counts hash, KEYS[3] periods index;
--   then per item: KEYS[2+2i] guard key, KEYS[3+2i] delivery key
-- ARGV[1] retention seconds, ARGV[2] `campaign:period`; then per item: delivery id, request
--   hash, request JSON
-- Returns per item {status, delivery id} with status 'new', 'duplicate' or 'conflict'.
local retention = tonumber(ARGV[1])
local now = now_ms()
local out, added, dups = {}, 0, 0
local n = (#KEYS - 3) / 2
for i = 1, n do
  local guard, dkey = KEYS[2 + 2 * i], KEYS[3 + 2 * i]
  local id, hash, request = ARGV[3 * i], ARGV[3 * i + 1], ARGV[3 * i + 2]
  local seen = redis.call('GET', guard)
  if seen then
    local sid, shash = string.match(seen, '^(%S+) (%S+)$')
    if shash == hash then
      out[i] = {'duplicate', sid}
      dups = dups + 1
    else
      out[i] = {'conflict', sid}
    end
  else
    redis.call('SET', guard, id .. ' ' .. hash, 'EX', retention)
    redis.call('HSET', dkey, 'state', 'pending', 'request', request, 'enqueued_ms', now)
    redis.call('XADD', KEYS[1], '*', 'delivery', id)
    added = added + 1
    out[i] = {'new', id}
  end
end
if added > 0 then
  redis.call('HINCRBY', KEYS[2], 'enqueued', added)
end
if dups > 0 then
  redis.call('HINCRBY', KEYS[2], 'duplicates', dups)
end
redis.call('EXPIRE', KEYS[2], retention)
redis.call('ZADD', KEYS[3], now, ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - retention * 1000)
redis.call('PEXPIRE', KEYS[3], retention * 1000)
return out
