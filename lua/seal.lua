-- seal.lua: before a batch request leaves, store its exact body, its Idempotency-Key and its
-- members, mark the members as belonging to it, and acknowledge their stream entries: from
-- here the batch record, not the stream, is what guarantees the members are settled.
-- Only members still processing under this owner's claim are sealed (a member taken over
-- by another instance is left out); the body is the sealed members' JSON, in order.
--
-- KEYS[1] batch, KEYS[2] batches zset, KEYS[3] stream, KEYS[3+i] delivery key of member i
-- ARGV[1] batch id, ARGV[2] idempotency key, ARGV[3] owner, ARGV[4] group,
-- ARGV[5] lease ms, ARGV[6] retention seconds;
--   then per member: stream entry id, delivery id, counts suffix (campaign:period), email JSON
-- Returns the 1-based positions of the sealed members (empty: nothing was sealed).
local bid, ikey, owner, group = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local lease, retention = tonumber(ARGV[5]), tonumber(ARGV[6])
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local sealed, entries, ids, tallies, items = {}, {}, {}, {}, {}
for i = 4, #KEYS do
  local m = i - 3
  local base = 6 + 4 * (m - 1)
  local d = redis.call('HMGET', KEYS[i], 'state', 'lease_owner')
  if d[1] == 'processing' and d[2] == owner then
    redis.call('HSET', KEYS[i], 'state', 'sealed', 'batch', bid)
    redis.call('HDEL', KEYS[i], 'lease_owner', 'lease_until')
    sealed[#sealed + 1] = m
    entries[#entries + 1] = ARGV[base + 1]
    ids[#ids + 1] = ARGV[base + 2]
    tallies[#tallies + 1] = ARGV[base + 3]
    items[#items + 1] = ARGV[base + 4]
  end
end
if #sealed == 0 then
  return {}
end
redis.call('XACK', KEYS[3], group, unpack(entries))
redis.call('HSET', KEYS[1], 'key', ikey, 'body', '[' .. table.concat(items, ',') .. ']',
  'members', table.concat(ids, ' '), 'tallies', table.concat(tallies, ' '),
  'sealed_ms', now, 'attempts', 0, 'owner', owner, 'state', 'sealed', 'maybe_sent', 0)
redis.call('EXPIRE', KEYS[1], retention)
redis.call('ZADD', KEYS[2], now + lease, bid)
return sealed
