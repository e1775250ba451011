-- gate.lua: the last gate, run immediately before a batch's request leaves (first send or
-- resend). In one step it checks that the batch is still held by this owner, that sending is
-- not paused, that it is within its deadline (and, if an earlier request may have been
-- processed, within the provider's idempotency window), and that every member is still
-- wanted: no address its email is sent to is suppressed (whoever supplied it: the registry,
-- an inline transactional recipient, the render hook; read from the batch's `addresses`,
-- hashed from the sealed body, against the partition's `suppressed` hash), and for a campaign
-- member, its subscriber is entitled, subscribed and not suppressed. Then it marks the batch
-- 'sending' (so a taker after a crash knows the request may have left) and counts the request
-- (`sends`: once per request that may leave, not per look: a second look before the request
-- left counts nothing, and reschedule.lua takes back the count of one put back unsent).
-- Members no longer wanted are settled 'skipped' here, compactly (prelude.lua), and join the
-- recent settlements and those of this minute. A batch never sent is re-sealed
-- without them under a new key (its body rebuilt byte-exactly from `sizes`); a batch that
-- may have been sent is resent byte-identical or not at all ('withhold').
--
-- KEYS[1] batch, KEYS[2] batches zset, KEYS[3] pause key, KEYS[4] suppressed addresses,
--   KEYS[5] recent settlements, KEYS[6] settlements per minute, KEYS[7..6+c] counts hashes, then
--   per member: delivery key, subscriber key
-- ARGV[1] batch id, ARGV[2] owner, ARGV[3] lease ms, ARGV[4] window ms, ARGV[5] deadline ms,
--   ARGV[6] maybe-sent deadline ms, ARGV[7] retention seconds, ARGV[8] new key, ARGV[9] c,
--   ARGV[10] '1' if the holder knows an earlier request may have been processed (it took the
--   batch so marked: a failover may have taken the record's mark back since), else '0';
--   then per member: its campaign (a subscriber may have turned one campaign off:
--   `off:<campaign>`), counts index (1-based), '1' to check its subscriber record
-- Returns one of:
--   {'go', sends}                                  send the batch as it is
--   {'resealed', sends, key, body, positions, skipped}   send this instead (positions: kept members)
--   {'empty', skipped}                             every member was skipped; the batch is gone
--   {'withhold', reasons}                          maybe sent and a member is no longer wanted
--   {'paused'} | {'expired'} | {'deadline', maybe_sent} | {'not_held'}
--   {'settled'}                                    no batch record, every member final: another
--                                                  holder settled it (a normal race)
--   {'lost'}                                       no batch record, a member not final
-- where skipped = 'position:reason ...' and reasons = one reason or '' per member.
local c = tonumber(ARGV[9]) or -1
local n = arity(6 + c, 2, 10, 3)
-- Member m's keys and arguments.
local function member(m)
  local k, a = 6 + c + 2 * (m - 1), 10 + 3 * (m - 1)
  return {dkey = KEYS[k + 1], skey = KEYS[k + 2], campaign = ARGV[a + 1], ci = tonumber(ARGV[a + 2]),
    check = ARGV[a + 3]}
end
local bid, owner = ARGV[1], ARGV[2]
local lease, window, deadline, unsure = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local retention, newkey = tonumber(ARGV[7]), ARGV[8]
local now = now_ms()
local b = hmget(KEYS[1], 'owner', 'maybe_sent', 'sealed_ms', 'first_sealed_ms', 'sizes', 'body', 'members',
  'addresses', 'state', 'sends')
if not b.owner then
  for m = 1, n do
    local dkey = member(m).dkey
    local state = redis.call('HGET', dkey, 'state')
    if not FINAL[state or ''] and not (not state and compacted(dkey)) then
      return {'lost'}
    end
  end
  return {'settled'}
end
if b.owner ~= owner then
  return {'not_held'}
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  return {'paused'}
end
-- A batch this holder already marked 'sending' is looked at again before its request left
-- (its slot moved): if it ends here, the request the first look counted was never made.
local function ends(reply)
  if b.state == 'sending' then
    redis.call('HINCRBY', KEYS[1], 'sends', -1)
  end
  return reply
end
local maybe_sent = b.maybe_sent == '1'
if ARGV[10] == '1' and not maybe_sent then
  -- What the holder knows stands: written back, for whoever takes the batch next.
  maybe_sent = true
  redis.call('HSET', KEYS[1], 'maybe_sent', '1')
end
if maybe_sent and now - tonumber(b.sealed_ms) > window then
  return ends({'expired'})
end
if maybe_sent and now - tonumber(b.sealed_ms) > unsure then
  return ends({'deadline', '1'})
end
if not maybe_sent and now - tonumber(b.first_sealed_ms) > deadline then
  return ends({'deadline', '0'})
end

-- Per member, the hashes of its email's addresses (a batch sealed before they were kept has
-- none: its members' subscriber records still say whether they are suppressed).
local addresses = {}
for group in string.gmatch(b.addresses or '', '%S+') do addresses[#addresses + 1] = group end
local function suppressed(m)
  for hash in string.gmatch(addresses[m] or '', '[^,]+') do
    if hash ~= '-' and redis.call('HEXISTS', KEYS[4], hash) == 1 then
      return true
    end
  end
  return false
end
local reasons, any = {}, false
for m = 1, n do
  local mb = member(m)
  local reason = ''
  local d = hmget(mb.dkey, 'state', 'batch')
  if d.state ~= 'sealed' or d.batch ~= bid then
    reason = 'record_lost'
  elseif suppressed(m) then
    reason = 'suppressed'
  elseif mb.check == '1' then
    local off = 'off:' .. mb.campaign
    local s = hmget(mb.skey, 'email', 'entitled', 'subscribed', 'suppressed', off)
    reason = unwanted(s.email, s.entitled, s.subscribed, s.suppressed, s[off])
  end
  reasons[m] = reason
  if reason ~= '' then any = true end
end

-- Marks the batch 'sending' (with `fields`), so a taker after a crash knows its request may
-- have left, and counts that request, unless this holder passed the gate before and no
-- request left since (still 'sending': the holder looks again after its slot moved).
local function sending(fields)
  local sends = tonumber(b.sends) or 0
  if b.state ~= 'sending' then
    sends = redis.call('HINCRBY', KEYS[1], 'sends', 1)
  end
  redis.call('HSET', KEYS[1], 'state', 'sending', unpack(fields))
  redis.call('ZADD', KEYS[2], now + lease, bid)
  return tostring(sends)
end

if not any then
  return {'go', sending({})}
end
if maybe_sent then
  return ends({'withhold', table.concat(reasons, ' ')})
end

-- Never sent: skip the members no longer wanted, keep the others under a new key.
local sizes, ids = {}, {}
for s in string.gmatch(b.sizes, '%S+') do sizes[#sizes + 1] = tonumber(s) end
for s in string.gmatch(b.members, '%S+') do ids[#ids + 1] = s end
local body, offset = b.body, 2
local kept_items, kept_sizes, kept_ids, kept_addresses, positions, skipped = {}, {}, {}, {}, {}, {}
local skips = 0
for m = 1, n do
  local item = string.sub(body, offset, offset + sizes[m] - 1)
  offset = offset + sizes[m] + 1
  if reasons[m] == '' then
    kept_items[#kept_items + 1] = item
    kept_sizes[#kept_sizes + 1] = sizes[m]
    kept_ids[#kept_ids + 1] = ids[m]
    kept_addresses[#kept_addresses + 1] = addresses[m] or '-'
    positions[#positions + 1] = tostring(m - 1)
  else
    skipped[#skipped + 1] = (m - 1) .. ':' .. reasons[m]
    local mb = member(m)
    local dkey, ci = mb.dkey, mb.ci
    if reasons[m] ~= 'record_lost' then
      compact(dkey, entry_text('skipped', now, reasons[m], 0), now, retention)
      redis.call('ZADD', KEYS[5], now, ids[m])
      redis.call('HINCRBY', KEYS[6 + ci], 'skipped', 1)
      skips = skips + 1
      redis.call('PEXPIREAT', KEYS[6 + ci], keep_until(KEYS[6 + ci], now, retention))
    end
  end
end
keep_recent(KEYS[5], now, retention)
tally_minute(KEYS[6], now, {skipped = skips})
if #kept_items == 0 then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], bid)
  return {'empty', table.concat(skipped, ' ')}
end
local newbody = '[' .. table.concat(kept_items, ',') .. ']'
local sends = sending({'key', newkey, 'body', newbody, 'sizes', table.concat(kept_sizes, ' '),
  'members', table.concat(kept_ids, ' '), 'addresses', table.concat(kept_addresses, ' '), 'sealed_ms', now})
return {'resealed', sends, newkey, newbody, table.concat(positions, ' '), table.concat(skipped, ' ')}
