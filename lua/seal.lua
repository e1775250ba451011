-- seal.lua: before a batch request leaves, store its exact body, its Idempotency-Key and its
-- members, mark the members as belonging to it, and acknowledge their stream entries: from
-- here the batch record, not the stream, is what guarantees the members are settled.
-- Only members still processing under this owner's claim are sealed (a member taken over
-- by another instance is left out); the body is the sealed members' JSON, in order, and
-- `sizes` keeps each member's length so the last gate can drop a member byte-exactly, and
-- `addresses` the salted hashes of every address each member's email is sent to, so the last
-- gate checks the partition's suppressed addresses against what the body really carries.
-- The batch record has no expiry: it lives until it is settled.
--
-- A batch may carry both lanes of its partition (receipts first, the spare room filled with
-- digest emails): each member's entry is acknowledged on its own lane's stream.
--
-- KEYS[1] batch, KEYS[2] batches zset, KEYS[3] digest stream, KEYS[4] transactional stream,
--   KEYS[4+i] delivery key of member i
-- ARGV[1] batch id, ARGV[2] idempotency key, ARGV[3] owner, ARGV[4] group, ARGV[5] lease ms;
--   then per member: stream entry id, delivery id, email JSON, A/B variant ('' for none; kept
--   on the record, counted as an exposure by settle.lua once the provider accepted it), the
--   hashes of its email's addresses, comma-separated ('-' for none)
-- Returns the 1-based positions of the sealed members (empty: nothing was sealed).
local n = arity(4, 1, 5, 5)
-- Member m's key and arguments.
local function member(m)
  local a = 5 + 5 * (m - 1)
  return {dkey = KEYS[4 + m], entry = ARGV[a + 1], id = ARGV[a + 2], email = ARGV[a + 3], variant = ARGV[a + 4],
    addresses = ARGV[a + 5]}
end
local bid, ikey, owner, group, lease = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local now = now_ms()
local sealed, entries, tx_entries, ids, items, sizes, addresses = {}, {}, {}, {}, {}, {}, {}
for m = 1, n do
  local mb = member(m)
  local d = hmget(mb.dkey, 'state', 'lease_owner')
  if d.state == 'processing' and d.lease_owner == owner then
    redis.call('HSET', mb.dkey, 'state', 'sealed', 'batch', bid)
    if mb.variant ~= '' then
      redis.call('HSET', mb.dkey, 'variant', mb.variant)
    end
    redis.call('HDEL', mb.dkey, 'lease_owner', 'lease_until')
    sealed[#sealed + 1] = m
    if string.sub(mb.id, 1, 14) == 'transactional:' then
      tx_entries[#tx_entries + 1] = mb.entry
    else
      entries[#entries + 1] = mb.entry
    end
    ids[#ids + 1] = mb.id
    items[#items + 1] = mb.email
    sizes[#sizes + 1] = #mb.email
    addresses[#addresses + 1] = mb.addresses
  end
end
if #sealed == 0 then
  return {}
end
if #entries > 0 then
  redis.call('XACK', KEYS[3], group, unpack(entries))
end
if #tx_entries > 0 then
  redis.call('XACK', KEYS[4], group, unpack(tx_entries))
end
redis.call('HSET', KEYS[1], 'key', ikey, 'body', '[' .. table.concat(items, ',') .. ']',
  'sizes', table.concat(sizes, ' '), 'members', table.concat(ids, ' '),
  'addresses', table.concat(addresses, ' '), 'first_sealed_ms', now, 'sealed_ms', now, 'owner', owner, 'state', 'sealed',
  'maybe_sent', 0, 'sends', 0, 'tries', 0)
redis.call('ZADD', KEYS[2], now + lease, bid)
return sealed
