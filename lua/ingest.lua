-- ingest.lua: enqueue transactional deliveries of one partition, each at most once per
-- caller idempotency key. The key's guard (SET, expiring the retention after the key's first
-- acceptance and never written again, whatever happens to its delivery since) names the
-- delivery it made and a hash of the request: a replay of the same request is a duplicate
-- (the same delivery, whenever it comes within the retention), the same key with a different
-- request is refused, as Resend refuses it (409). The delivery record keeps the request
-- (recipient, content, data): the only place an address given inline is kept; the stream
-- entry carries the id only. Recorded, written to the transactional stream and counted in
-- one atomic step; an item whose template lists the application channel gets its event's
-- delivery (`<id>:app`) in the same step. The event's record keeps what the event needs of
-- the request (its template and data keys, never an address): the email's record is gone
-- once it is sent (prelude.lua). The day's first item fixes the day's number of
-- settled-history buckets, for as many deliveries as the day before had.
-- Each address an item is sent to inline (`to`, hashed as suppressions are: never the address)
-- joins the partition's address index (`by_address`: member `<hash>:<delivery id>`, scored by
-- when its key's guard expires), what the admin page's search and erasure read to find the
-- deliveries addressed to someone; entries past their score are pruned here, and the index
-- expires with its newest.
-- An item's attachments are kept in a field of their own (`attachments`, deleted when it
-- settles: settle.lua, decide.lua) and their size in the partition's pending-attachments hash
-- (delivery id -> bytes); an item whose attachments would take the partition's pending bytes
-- past the limit is not enqueued ('over': the caller tries again later). Entries of deliveries
-- since settled are pruned by the caller before, so the sum only over-counts.
--
-- KEYS[1] transactional stream, KEYS[2] counts hash, KEYS[3] periods index, KEYS[4] the
--   application stream, KEYS[5] the application channel's counts hash, KEYS[6] the counts
--   hash of the day before, KEYS[7] the partition's pending attachments, KEYS[8] its address
--   index; then per item: KEYS[6+3i] guard key, KEYS[7+3i] delivery key, KEYS[8+3i] its event's key
-- ARGV[1] retention seconds, ARGV[2] `campaign:period`, ARGV[3] the most attachment bytes
--   pending in the partition; then per item: delivery id, request hash, request JSON, its
--   event's request JSON ('' without the application channel), its attachments' JSON ('' for
--   none), their bytes (0 for none), the hashes of the addresses it is sent to inline
--   (comma-separated; '-' for none)
-- Returns per item {status, delivery id} with status 'new', 'duplicate', 'conflict' or 'over'.
local n = arity(8, 3, 3, 7)
-- Item i's keys and arguments.
local function member(i)
  local a = 3 + 7 * (i - 1)
  return {guard = KEYS[6 + 3 * i], dkey = KEYS[7 + 3 * i], akey = KEYS[8 + 3 * i], id = ARGV[a + 1],
    hash = ARGV[a + 2], request = ARGV[a + 3], event = ARGV[a + 4], attachments = ARGV[a + 5],
    bytes = tonumber(ARGV[a + 6]), addresses = ARGV[a + 7]}
end
local retention, most_pending = tonumber(ARGV[1]), tonumber(ARGV[3])
local pending = 0
for _, b in ipairs(redis.call('HVALS', KEYS[7])) do
  pending = pending + tonumber(b)
end
local now = now_ms()
local out, added, dups, app_added, app_dups = {}, 0, 0, 0, 0
local indexed = false
local function fix_buckets(counts)
  if redis.call('HEXISTS', counts, 'buckets') == 0 then
    buckets(counts, tonumber(redis.call('HGET', KEYS[6], 'enqueued') or '0'))
  end
end
for i = 1, n do
  local item = member(i)
  local guard, dkey, akey = item.guard, item.dkey, item.akey
  local id, hash, request, event = item.id, item.hash, item.request, item.event
  local app = event ~= ''
  local seen = redis.call('GET', guard)
  if not seen and item.bytes > 0 and pending + item.bytes > most_pending then
    out[i] = {'over', id}
  elseif seen then
    local sid, shash = string.match(seen, '^(%S+) (%S+)$')
    if shash == hash then
      out[i] = {'duplicate', sid}
      dups = dups + 1
      if app then
        app_dups = app_dups + 1
      end
    else
      out[i] = {'conflict', sid}
    end
  else
    redis.call('SET', guard, id .. ' ' .. hash, 'PXAT', now + retention * 1000)
    redis.call('HSET', dkey, 'state', 'pending', 'request', request, 'enqueued_ms', now)
    if item.attachments ~= '' then
      redis.call('HSET', dkey, 'attachments', item.attachments)
      redis.call('HSET', KEYS[7], id, item.bytes)
      pending = pending + item.bytes
    end
    redis.call('XADD', KEYS[1], '*', 'delivery', id)
    for address in string.gmatch(item.addresses, '[^,]+') do
      if address ~= '-' then
        redis.call('ZADD', KEYS[8], now + retention * 1000, address .. ':' .. id)
        indexed = true
      end
    end
    added = added + 1
    if app and redis.call('HSETNX', akey, 'state', 'pending') == 1 then
      redis.call('HSET', akey, 'enqueued_ms', now, 'request', event)
      redis.call('XADD', KEYS[4], '*', 'delivery', id .. ':app')
      app_added = app_added + 1
    end
    out[i] = {'new', id}
  end
end
if added > 0 then
  fix_buckets(KEYS[2])
  redis.call('HINCRBY', KEYS[2], 'enqueued', added)
end
if dups > 0 then
  redis.call('HINCRBY', KEYS[2], 'duplicates', dups)
end
redis.call('PEXPIREAT', KEYS[2], keep_until(KEYS[2], now, retention))
if app_added > 0 then
  fix_buckets(KEYS[5])
  redis.call('HINCRBY', KEYS[5], 'enqueued', app_added)
end
if app_dups > 0 then
  redis.call('HINCRBY', KEYS[5], 'duplicates', app_dups)
end
if app_added + app_dups > 0 then
  redis.call('PEXPIREAT', KEYS[5], keep_until(KEYS[5], now, retention))
end
if indexed then
  redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', '(' .. now)
  redis.call('PEXPIREAT', KEYS[8], now + retention * 1000)
end
list_period(KEYS[3], ARGV[2], now + retention * 1000, now)
return out
