-- prelude.lua: joined in front of every other script of lua/ when it is embedded
-- (src/db/scripts/mod.rs), so what several scripts need is written once. A script
-- stays one atomic step: the prelude only defines functions.

-- Redis's clock in milliseconds: the one clock of leases, due times and windows.
local function now_ms()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end

-- A partition's recent settlements (`recent`): delivery ids scored by when they settled, read
-- by the delivery log for its newest-first pages. Whoever settles adds the id; this keeps the
-- newest RECENT_KEEP within the retention, and lets the key expire with the retention if
-- nothing settles. Display only: nothing on the sending path reads it.
local RECENT_KEEP = 10000
local function keep_recent(key, now, retention)
  redis.call('ZREMRANGEBYRANK', key, 0, -RECENT_KEEP - 1)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. (now - retention * 1000))
  redis.call('EXPIRE', key, retention)
end

-- The states a settled delivery record may be in.
local FINAL = {sent = true, failed = true, skipped = true, outcome_unknown = true}

-- Why a subscriber record no longer wants a campaign's mail ('' if it does), given
-- HMGET email, entitled, subscribed, suppressed, off:<campaign>. The same rule, in
-- the same order, as `subscribers::ineligible` (a test holds them together).
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
