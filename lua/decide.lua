-- decide.lua: settle claimed deliveries that will not be sent (skipped: no longer wanted at
-- send time; failed: cannot be rendered, claimed too often, or its record was lost) and
-- acknowledge their stream entries. Only deliveries this owner still holds change, except a
-- lost record, which is written back as failed so the operator sees it and can requeue it
-- (lost: no record, and none kept compactly either). A delivery sent (an application event)
-- or skipped is settled compactly (prelude.lua); a failed or outcome_unknown record expires
-- with its period's dedup (keep_until). Each joins the recent settlements and the settlements
-- of this minute (prelude.lua, tally_minute); failed ones go to the dead-letter stream.
--
-- KEYS[1] stream, KEYS[2] dead stream, KEYS[3] recent settlements, KEYS[4] settlements per
-- minute, KEYS[5..4+c] counts hashes, KEYS[5+c..] delivery keys
-- ARGV[1] group, ARGV[2] owner, ARGV[3] c, ARGV[4] retention seconds;
--   then per delivery: stream entry id, delivery id, state, reason, counts index (1-based),
--   expect ('held': claimed by owner, 'lost': the record is missing)
-- Returns, per delivery, 1 if it was decided now, 0 if not (no longer ours, or no longer lost).
local c = tonumber(ARGV[3]) or -1
local n = arity(4 + c, 1, 4, 6)
-- Delivery m's key and arguments.
local function member(m)
  local a = 4 + 6 * (m - 1)
  return {dkey = KEYS[4 + c + m], entry = ARGV[a + 1], id = ARGV[a + 2], state = ARGV[a + 3], reason = ARGV[a + 4],
    ci = tonumber(ARGV[a + 5]), expect = ARGV[a + 6]}
end
local group, owner, retention = ARGV[1], ARGV[2], tonumber(ARGV[4])
local now = now_ms()
local out, tally = {}, {}
for m = 1, n do
  local mb = member(m)
  local dkey, entry, id, state, reason, ci = mb.dkey, mb.entry, mb.id, mb.state, mb.reason, mb.ci
  local d = hmget(dkey, 'state', 'lease_owner')
  local ours = (mb.expect == 'held' and d.state == 'processing' and d.lease_owner == owner)
    or (mb.expect == 'lost' and not d.state and not compacted(dkey))
  if ours then
    if state == 'sent' or state == 'skipped' then
      compact(dkey, entry_text(state, now, reason, 0), now, retention)
    else
      local field = 'reason'
      if state == 'failed' then field = 'error' end
      redis.call('HSET', dkey, 'state', state, field, reason, 'settled_ms', now)
      drop_attachments(dkey)
      redis.call('HDEL', dkey, 'lease_owner', 'lease_until')
      redis.call('PEXPIREAT', dkey, keep_until(KEYS[4 + ci], now, retention))
    end
    redis.call('ZADD', KEYS[3], now, id)
    redis.call('HINCRBY', KEYS[4 + ci], state, 1)
    redis.call('PEXPIREAT', KEYS[4 + ci], keep_until(KEYS[4 + ci], now, retention))
    if state == 'failed' then
      redis.call('XADD', KEYS[2], 'MINID', '~', now - retention * 1000, '*',
        'delivery', id, 'error', reason, 'attempts', 0)
    end
    tally[state] = (tally[state] or 0) + 1
    redis.call('XACK', KEYS[1], group, entry)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
keep_recent(KEYS[3], now, retention)
tally_minute(KEYS[4], now, tally)
return out
