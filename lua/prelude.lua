-- prelude.lua: joined in front of every other script of lua/ when it is embedded
-- (src/store/scripts/mod.rs), so what several scripts need is written once. A script
-- stays one atomic step: the prelude only defines functions.

-- The call's shape, checked first by every script: KEYS is `fixed_keys` keys and then
-- `keys_per_item` per item, ARGV `fixed_args` arguments and then `args_per_item` per item
-- (0: the side carries nothing per item), the same number of items on both sides. A Rust
-- call and its script that drift apart meet this error, never a nil read further down.
-- Returns the number of items.
local function arity(fixed_keys, keys_per_item, fixed_args, args_per_item)
  local keys, args = #KEYS - fixed_keys, #ARGV - fixed_args
  local n = 0
  if keys_per_item > 0 then
    n = keys / keys_per_item
  elseif args_per_item > 0 then
    n = args / args_per_item
  end
  if keys < 0 or args < 0 or n ~= math.floor(n) or keys ~= n * keys_per_item or args ~= n * args_per_item then
    error(string.format('arity: %d keys and %d arguments do not fit %d + %d per item keys and %d + %d per item '
      .. 'arguments', #KEYS, #ARGV, fixed_keys, keys_per_item, fixed_args, args_per_item))
  end
  return n
end

-- HMGET by name: a table of the fields asked for, read as `d.state`, never `d[1]` (false
-- for a field the hash does not have, as HMGET says it).
local function hmget(key, ...)
  local names = {...}
  local values = redis.call('HMGET', key, ...)
  local record = {}
  for i = 1, #names do
    record[names[i]] = values[i]
  end
  return record
end

-- Redis's clock in milliseconds: the one clock of leases, due times and windows.
local function now_ms()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end

-- A partition's recent settlements (`recent`): delivery ids scored by when they settled, read
-- by the delivery log for its newest-first pages. Whoever settles adds the id; this keeps the
-- newest RECENT_KEEP within the retention, and lets the key expire with the retention if
-- nothing settles. Display only: nothing on the sending path reads it.
local RECENT_KEEP = 1000
local function keep_recent(key, now, retention)
  redis.call('ZREMRANGEBYRANK', key, 0, -RECENT_KEEP - 1)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. (now - retention * 1000))
  redis.call('EXPIRE', key, retention)
end

-- A partition's settlements per minute (`per_minute`), for the admin overview's chart of the
-- last hour: field `<minute>:<state>` (minutes since the epoch, Redis's clock) counts the
-- deliveries settled in that minute. Whoever settles adds its call's tally (state -> count):
-- one HINCRBY per state per call, never one per member. Minutes older than the hour are
-- deleted as the hour moves on (`oldest` names the oldest minute kept), and the key expires
-- when nothing settles for PER_MINUTE_KEEP seconds. Display only: nothing on the sending path
-- reads it.
local PER_MINUTE_KEEP = 3900
local PER_MINUTE_STATES = {'sent', 'failed', 'outcome_unknown', 'skipped'}
local function tally_minute(key, now, tally)
  local minute = math.floor(now / 60000)
  local any = false
  for _, state in ipairs(PER_MINUTE_STATES) do
    if (tally[state] or 0) > 0 then
      redis.call('HINCRBY', key, minute .. ':' .. state, tally[state])
      any = true
    end
  end
  if not any then
    return
  end
  local kept = tonumber(redis.call('HGET', key, 'oldest'))
  local oldest = kept or minute
  if oldest < minute - 60 then
    local gone = {}
    if oldest >= minute - 130 then
      -- The minutes since the key last changed: at most PER_MINUTE_KEEP's (it expires then).
      for m = oldest, minute - 61 do
        for _, state in ipairs(PER_MINUTE_STATES) do
          gone[#gone + 1] = m .. ':' .. state
        end
      end
    else
      -- Redis's clock jumped ahead: whatever is older than the hour, read from the hash.
      for _, field in ipairs(redis.call('HKEYS', key)) do
        local m = tonumber(string.match(field, '^(%d+):'))
        if m and m < minute - 60 then
          gone[#gone + 1] = field
        end
      end
    end
    if #gone > 0 then
      redis.call('HDEL', key, unpack(gone))
    end
    oldest = minute - 60
  end
  if oldest ~= kept then
    redis.call('HSET', key, 'oldest', oldest)
  end
  redis.call('EXPIRE', key, PER_MINUTE_KEEP)
end

-- What happened to a delivery, one line per event, `<ms>\t<kind>\t<outcome>\t<name>\t<said>`:
-- a request that failed or a verdict (`attempt`: `retry`, `failed` or `outcome_unknown`, the
-- error name, what Resend said, its addresses masked by the caller) or an operator's action
-- (`operator`: `retry`, and who). A batch keeps its failed requests (`attempts`, reschedule.lua)
-- until it settles, and a member recorded failed or outcome_unknown gets them with the verdict
-- (settle.lua); requeue.lua adds the operator's retry. Only records that exist keep one, so it
-- goes with the record: a delivery settled sent or skipped keeps only its compact entry. The
-- newest HISTORY_KEEP lines of each kind are kept.
local HISTORY_KEEP = 10
local function history_line(now, kind, outcome, name, said)
  local clean = string.gsub(said or '', '[\t\r\n]', ' ')
  return table.concat({now, kind, outcome, name, clean}, '\t')
end
local function kept_history(...)
  local all, kept, seen = {}, {}, {}
  for _, text in ipairs({...}) do
    for line in string.gmatch(text or '', '[^\n]+') do
      all[#all + 1] = line
    end
  end
  for i = #all, 1, -1 do
    local kind = string.match(all[i], '^%d+\t(%a+)\t') or ''
    seen[kind] = (seen[kind] or 0) + 1
    if seen[kind] <= HISTORY_KEEP then
      table.insert(kept, 1, all[i])
    end
  end
  return table.concat(kept, '\n')
end

-- The states a settled delivery record may be in.
local FINAL = {sent = true, failed = true, skipped = true, outcome_unknown = true}

-- Why a subscriber record no longer wants a campaign's mail ('' if it does), given its
-- email, entitled, subscribed, suppressed and off:<campaign> fields. The same rule, in the
-- same order, as `subscribers::Unwanted` (a test holds them together).
local function unwanted(email, entitled, subscribed, suppressed, off)
  if not email then
    return 'unknown_subscriber'
  elseif suppressed then
    return 'suppressed'
  elseif entitled ~= '1' then
    return 'not_entitled'
  elseif subscribed ~= '1' or off then
    return 'unsubscribed'
  end
  return ''
end

-- Settled history (key layout 7). A delivery settled `sent` or `skipped` does not keep its
-- record: what the delivery log, the SLO and its period's dedup need of it is one field of a
-- bucket of its campaign period, `settled:<campaign>:<period>[:<channel>]:<n>`, named
-- `<subscriber>:<target>` and holding `<state> <settled_ms> <detail>[ <sends>]` (detail: the
-- provider's email id, or the reason; `-` for none; sends, the requests made, when not 1), then ` fallback` and ` variant=<v>` where
-- they apply. A `failed` or `outcome_unknown` delivery keeps its whole record: it is a dead
-- letter an operator reads and may requeue, and there are few. A period has a fixed number of
-- buckets, a power of two recorded as `buckets` in its counts hash by its first enqueue (for
-- about BUCKET_FILL deliveries each, so every bucket stays a small listpack); a delivery's
-- bucket is a hash of its home (the subscriber; a receipt's idempotency key) modulo that
-- number, so a subscriber's deliveries of a period share one. A bucket expires with its counts
-- hash (keep_until, below). Every name here is built from the
-- delivery's own key, so it carries the same hash tag: one slot (`db::history` builds the
-- same names in Rust, and a test holds the two together).
local BUCKET_FILL, MAX_BUCKETS = 48, 65536

local function buckets_for(expected)
  local n = 1
  while n * BUCKET_FILL < expected and n < MAX_BUCKETS do
    n = n * 2
  end
  return n
end

-- The bucket count of the period whose counts hash is `counts`: the recorded one, or one
-- recorded now for `expected` deliveries (nil: as many as its counts say were enqueued).
local function buckets(counts, expected)
  local n = redis.call('HGET', counts, 'buckets')
  if n then
    return tonumber(n)
  end
  n = buckets_for(expected or tonumber(redis.call('HGET', counts, 'enqueued') or '0'))
  redis.call('HSET', counts, 'buckets', n)
  return n
end

-- h = h * 31 + byte over the string, modulo 2^31 - 1 (exact in Lua's doubles).
local function home_hash(s)
  local h = 0
  for i = 1, #s do
    h = (h * 31 + string.byte(s, i)) % 2147483647
  end
  return h
end

-- For the record key `dkey` (`<prefix>:{p}:d:<id>`): its period's counts hash, the prefix of
-- its buckets' names, its home's hash and its field.
local function history(dkey)
  local at = string.find(dkey, '}:d:', 1, true)
  local base, p = string.sub(dkey, 1, at), {}
  for part in string.gmatch(string.sub(dkey, at + 4), '[^:]+') do
    p[#p + 1] = part
  end
  local period = p[1] .. ':' .. p[2]
  if p[5] then
    period = period .. ':' .. p[5]
  end
  local home = p[3]
  if p[1] == 'transactional' then
    home = p[4]
  end
  return base .. ':counts:' .. period, base .. ':settled:' .. period .. ':', home_hash(home), p[3] .. ':' .. p[4]
end

-- A compact entry's text.
local function entry_text(state, now, detail, sends, fallback, variant)
  if not detail or detail == '' then
    detail = '-'
  end
  local v = state .. ' ' .. now .. ' ' .. detail
  -- Requests made: left out when one (most entries), so it costs nothing there.
  if tostring(sends or 0) ~= '1' then
    v = v .. ' ' .. (sends or 0)
  end
  if fallback == '1' then
    v = v .. ' fallback'
  end
  if variant and variant ~= '' then
    v = v .. ' variant=' .. variant
  end
  return v
end

-- One clock for every age that guards a dedup (key layout 8). A campaign period may be kicked
-- until its `kick_until` (Redis-clock ms): the period's start (from the calendar, in its
-- campaign's zone) plus the kick window's retention (the shortest `delivery.retention_days` the
-- deployment has run with: `<prefix>:meta` `kick_window_s`), or what the period's first enqueue
-- recorded in its counts hash, whichever is earlier. Every trace the kick's dedup reads -- the
-- counts hash, the settled history's buckets, a failed or outcome_unknown record -- and the
-- period's entry in the periods index expire at `keep_until`: the retention after they were
-- last written, and never before the recorded `kick_until`. Both ends are computed here, from
-- the same recorded number, on the same clock, so no kick is accepted once any of them may have
-- expired, whenever the period was kicked (early as "the next period", on time, or late) and
-- whenever it settled. A counts hash without `kick_until` (a transactional day: its dedup is the
-- idempotency key's guard) keeps the retention after its last write.
local function kick_until(start_ms, window_s)
  return start_ms + window_s * 1000
end

-- The kick window's end as the counts hash `counts` recorded it, or nil.
local function recorded_kick_until(counts)
  return tonumber(redis.call('HGET', counts, 'kick_until') or '')
end

local kept = {}
-- When the traces of the period whose counts hash is `counts`, written now, expire (ms).
local function keep_until(counts, now, retention)
  local k = kept[counts]
  if not k then
    k = now + retention * 1000
    local kick = recorded_kick_until(counts)
    if kick and kick > k then
      k = kick
    end
    kept[counts] = k
  end
  return k
end

-- Lists `member` (`<campaign>:<period>`) in the partition's periods index `index` (what
-- /metrics and `mailstream slo` report on), scored by when its traces are kept until (`keep`,
-- ms; a later write never shortens it), drops the periods kept no longer, and keeps the index
-- as long as its last period.
local function list_period(index, member, keep, now)
  redis.call('ZADD', index, 'GT', keep, member)
  redis.call('ZREMRANGEBYSCORE', index, '-inf', '(' .. now)
  local last = redis.call('ZRANGE', index, -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIREAT', index, last[2])
  end
end

-- A delivery's attachments wait only to be sent: once it settles failed or outcome_unknown
-- (its record kept for the operator) they are deleted, and the record says so (a retry of it
-- is refused: its files are gone).
local function drop_attachments(dkey)
  if redis.call('HDEL', dkey, 'attachments') == 1 then
    redis.call('HSET', dkey, 'attachments_deleted', '1')
  end
end

-- Settles the delivery of record `dkey` compactly: its entry written, its bucket's expiry
-- renewed (keep_until), its record deleted.
local function compact(dkey, value, now, retention)
  local counts, prefix, h, field = history(dkey)
  local bucket = prefix .. (h % buckets(counts))
  redis.call('HSET', bucket, field, value)
  redis.call('PEXPIREAT', bucket, keep_until(counts, now, retention))
  redis.call('DEL', dkey)
end

-- The state the delivery of record `dkey` was settled compactly in, or nil.
local function compacted(dkey)
  local counts, prefix, h, field = history(dkey)
  local n = redis.call('HGET', counts, 'buckets')
  if not n then
    return nil
  end
  local v = redis.call('HGET', prefix .. (h % tonumber(n)), field)
  return v and string.match(v, '^%S+')
end
