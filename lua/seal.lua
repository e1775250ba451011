-- seal.lua: before a batch request leaves, store its exact body, its Idempotency-Key and its
-- members, mark the members as belonging to it, and acknowledge their stream entries: from
-- here the batch record, not the stream, is what guarantees the members are settled.
-- Only members still processing under this owner's claim are sealed (a member taken over
-- by another instance is left out); the body is the sealed members' JSON, in order, and
-- `sizes` keeps each member's length so the last gate can drop a member byte-exactly.
-- The batch record has no expiry: it lives until it is settled.
--
-- KEYS[1] batch, KEYS[2] batches zset, KEYS[3] stream, KEYS[3+i] delivery key of member i
-- ARGV[1] batch id, ARGV[2] idempotency key, ARGV[3] owner, ARGV[4] group, ARGV[5] lease ms;
--   then per member: stream entry id, delivery id, email JSON
-- Returns the 1-based positions of the sealed members (empty: nothing was sealed).
local bid, ikey, owner, group, lease = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local sealed, entries, ids, items, sizes = {}, {}, {}, {}, {}
for i = 4, #KEYS do
  local m = i - 3
  local base = 5 + 3 * (m - 1)
  local d = redis.call('HMGET', KEYS[i], 'state', 'lease_owner')
  if d[1] == 'processing' and d[2] == owner then
    redis.call('HSET', KEYS[i], 'state', 'sealed', 'batch', bid)
    redis.call('HDEL', KEYS[i], 'lease_owner', 'lease_until')
    sealed[#sealed + 1] = m
    entries[#entries + 1] = ARGV[base + 1]
    ids[#ids + 1] = ARGV[base + 2]
    items[#items + 1] = ARGV[base + 3]
    sizes[#sizes + 1] = #ARGV[base + 3]
  end
end
if #sealed == 0 then
  return {}
end
redis.call('XACK', KEYS[3], group, unpack(entries))
redis.call('HSET', KEYS[1], 'key', ikey, 'body', '[' .. table.concat(items, ',') .. ']',
  'sizes', table.concat(sizes, ' '), 'members', table.concat(ids, ' '),
  'first_sealed_ms', now, 'sealed_ms', now, 'owner', owner, 'state', 'sealed',
  'maybe_sent', 0, 'sends', 0, 'tries', 0)
redis.call('ZADD', KEYS[2], now + lease, bid)
return sealed
