-- settle.lua: record the final outcome of each member of a sealed batch, then delete the
-- batch (its body holds addresses). Idempotent: a batch already settled is left alone, and
-- only members still sealed into this batch change. A member sent is settled compactly (its
-- entry in its period's settled history, its record deleted: prelude.lua); a failed or
-- outcome_unknown one keeps its record, which expires with its period's dedup (keep_until in
-- prelude.lua: the retention from here, and never before the period's kick window ends). A sent member with an A/B variant counts as that variant's exposure
-- (`exposed:<variant>` in the counts hash); failed members go to the dead-letter stream and
-- outcome_unknown ones to the unknown stream, with the number of requests made, and keep the
-- batch's failed requests and this verdict in their history (prelude.lua). Every member
-- settled now joins the partition's recent settlements (the delivery log's newest first) and
-- its settlements of this minute (prelude.lua, tally_minute).
--
-- Three kinds of callers, named by the mode. The provider's 2xx answer for the batch's key is
-- authoritative, so anyone may record it ('answer'): a replay gives every holder the same answer, and if the
-- batch record itself is gone (a lost write), the answer is still recorded on every member
-- not yet settled, and the caller is told ('missing'), so nothing is sent again. A verdict
-- without such an answer (giving up, a fatal error, a passed deadline) needs the current
-- holder ('holder'), and a member the batch says may have been sent becomes outcome_unknown,
-- never failed. A lost batch ('lost', found by its members) settles members still sealed into
-- it as given.
--
-- KEYS[1] batch, KEYS[2] batches zset, KEYS[3] dead stream, KEYS[4] unknown stream,
-- KEYS[5] recent settlements, KEYS[6] settlements per minute, KEYS[7..6+c] counts hashes,
--   KEYS[7+c..] delivery keys of the members
-- ARGV[1] batch id, ARGV[2] c (number of counts keys), ARGV[3] retention seconds,
-- ARGV[4] mode: 'answer' (a 2xx answer), 'holder' (a verdict of the holder) or 'lost' (a lost
--   batch), ARGV[5] the holder ('' unless 'holder');
--   then per member: delivery id, state, detail (provider id or error name), counts index
--   (1-based), and what the provider said of it ('' for nothing; kept as `error_message`
--   on a member recorded failed or outcome_unknown now)
-- Returns {status, per member the state recorded now ('' where nothing changed)} with status
-- 'ok', 'not_held', 'settled' (no batch record, and every member was already final: another
-- holder settled it first, a normal race) or 'missing' (no batch record while a member was not
-- final: a lost write; an answer was recorded anyway).
local c = tonumber(ARGV[2]) or -1
local n = arity(6 + c, 1, 5, 5)
-- Member m's key and arguments.
local function member(m)
  local a = 5 + 5 * (m - 1)
  return {dkey = KEYS[6 + c + m], id = ARGV[a + 1], state = ARGV[a + 2], detail = ARGV[a + 3],
    ci = tonumber(ARGV[a + 4]), said = ARGV[a + 5]}
end
local bid, retention, mode, holder = ARGV[1], tonumber(ARGV[3]), ARGV[4], ARGV[5]
if mode ~= 'answer' and mode ~= 'holder' and mode ~= 'lost' then
  return redis.error_reply('settle.lua: no mode ' .. mode)
end
local out = {}
local b = hmget(KEYS[1], 'owner', 'maybe_sent', 'sends', 'attempts')
local status = 'ok'
if not b.owner then
  status = 'missing'
  if mode == 'holder' then
    for m = 1, n do out[m] = '' end
    return {status, out}
  end
elseif mode == 'holder' and b.owner ~= holder then
  for m = 1, n do out[m] = '' end
  return {'not_held', out}
end
local now = now_ms()
local sends = b.sends or 0
local all_final, counted, tally = true, {}, {}
for m = 1, n do
  local mb = member(m)
  local dkey, id, state, detail, ci = mb.dkey, mb.id, mb.state, mb.detail, mb.ci
  if state == 'failed' and mode ~= 'answer' and b.maybe_sent == '1' then
    state = 'outcome_unknown'
  end
  local d = hmget(dkey, 'state', 'batch', 'variant', 'fallback')
  if status == 'missing' and all_final and not FINAL[d.state or ''] then
    -- Settled by another holder and kept compactly since, or not final at all.
    all_final = not d.state and compacted(dkey) ~= nil
  end
  local open = d.state == 'sealed' and d.batch == bid
  if status == 'missing' and mode == 'answer' then
    -- The seal was lost but the provider accepted: record it unless already final.
    open = d.state == 'sealed' or d.state == 'processing' or d.state == 'pending'
  end
  if open then
    if state == 'sent' then
      compact(dkey, entry_text('sent', now, detail, sends, d.fallback, d.variant), now, retention)
    else
      local told = history_line(now, 'attempt', state, detail, mb.said)
      local before = redis.call('HGET', dkey, 'history')
      redis.call('HSET', dkey, 'state', state, 'error', detail, 'settled_ms', now, 'sends', sends,
        'history', kept_history(before, b.attempts, told))
      drop_attachments(dkey)
      if mb.said ~= '' then
        redis.call('HSET', dkey, 'error_message', mb.said)
      end
      redis.call('HDEL', dkey, 'lease_owner', 'lease_until')
      redis.call('PEXPIREAT', dkey, keep_until(KEYS[6 + ci], now, retention))
    end
    redis.call('ZADD', KEYS[5], now, id)
    redis.call('HINCRBY', KEYS[6 + ci], state, 1)
    if state == 'sent' then
      -- An A/B exposure counts only once the provider accepted the email.
      if d.variant then
        redis.call('HINCRBY', KEYS[6 + ci], 'exposed:' .. d.variant, 1)
      end
    end
    counted[ci] = true
    tally[state] = (tally[state] or 0) + 1
    if state == 'failed' then
      redis.call('XADD', KEYS[3], 'MINID', '~', now - retention * 1000, '*',
        'delivery', id, 'error', detail, 'attempts', sends)
    elseif state == 'outcome_unknown' then
      redis.call('XADD', KEYS[4], 'MINID', '~', now - retention * 1000, '*',
        'delivery', id, 'error', detail, 'attempts', sends)
    end
    out[#out + 1] = state
  else
    out[#out + 1] = ''
  end
end
for ci in pairs(counted) do
  redis.call('PEXPIREAT', KEYS[6 + ci], keep_until(KEYS[6 + ci], now, retention))
end
keep_recent(KEYS[5], now, retention)
tally_minute(KEYS[6], now, tally)
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], bid)
if status == 'missing' and all_final then
  status = 'settled'
end
return {status, out}
