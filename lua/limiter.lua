-- limiter.lua: the team-wide request limiter, shared by every instance (one key, Redis TIME
-- the only clock). No burst: each departure moves the next allowed one an interval later,
-- and an idle limiter banks nothing (GCRA with no tolerance). A 429's retry-after pauses
-- every instance; a lower ratelimit-limit announced by the provider is adopted team-wide.
--
-- KEYS[1] limiter hash: next_us (earliest next departure), pause_us (no departure before),
--   rps (a lower rate the provider announced)
-- ARGV[1] op: 'take' | 'peek' | 'pause' | 'lower' | 'late'
-- ARGV[2] configured interval in µs (1 s / rps + guard), ARGV[3] guard µs, ARGV[4] argument:
--   pause: milliseconds; lower: requests per second; late: the real departure, Redis µs;
-- ARGV[5] (tests only) a fake "now" in µs instead of Redis TIME
-- Returns {wait_us, now_us}: for 'take', 0 when the slot is taken now (the request leaves at
-- once), else how long until it can be; for 'lower', 1 when the rate was lowered.
local op, interval, guard, arg = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4] or '0')
local now = tonumber(ARGV[5] or '')
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local h = redis.call('HMGET', KEYS[1], 'next_us', 'pause_us', 'rps')
local rps = tonumber(h[3] or '0')
if rps > 0 then
  interval = math.max(interval, math.floor(1000000 / rps) + guard)
end
local nxt = math.max(tonumber(h[1] or '0'), tonumber(h[2] or '0'))
local result = {0, now}
if op == 'take' then
  if now >= nxt then
    redis.call('HSET', KEYS[1], 'next_us', now + interval)
  else
    result = {nxt - now, now}
  end
elseif op == 'peek' then
  result = {math.max(0, nxt - now), now}
elseif op == 'pause' then
  redis.call('HSET', KEYS[1], 'pause_us', math.max(tonumber(h[2] or '0'), now + arg * 1000))
elseif op == 'lower' then
  if arg >= 1 and (rps == 0 or arg < rps) then
    redis.call('HSET', KEYS[1], 'rps', arg)
    result = {1, now}
  end
elseif op == 'late' then
  redis.call('HSET', KEYS[1], 'next_us', math.max(tonumber(h[1] or '0'), arg + interval))
end
-- Forgotten an hour after the last request: a lowered rate or a pause does not outlive that.
redis.call('PEXPIRE', KEYS[1], 3600000)
return result
