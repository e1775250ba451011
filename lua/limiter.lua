-- limiter.lua: the team-wide request limiter, shared by every instance (one key, Redis TIME
-- the only clock). Two rules decide when the next request may leave:
--  * the window: a request leaves no sooner than one second plus the guard after the
--    departure of the request `rps` before it, so the provider never counts more than `rps`
--    in any sliding second. Departures are recorded as upper bounds, in a ring of the last
--    `ring` of them: the grant plus 1 ms at first, then the time 'late' runs, which the
--    sender calls once its request is written;
--  * the cadence: one request per 1/rps, so requests are spread evenly. A taker up to a
--    little late for its slot keeps the cadence (the window rule still holds); one that comes
--    after an idle spell starts it again from now, so an idle limiter banks nothing.
-- The guard is paid once per sliding second, not once per request. A 429's retry-after
-- pauses every instance; a lower ratelimit-limit announced by the provider is adopted
-- team-wide.
--
-- KEYS[1] limiter hash: next_us (cadence), pause_us (no departure before), rps (a lower rate
--   the provider announced), seq (requests granted), ring (ring size), d<n> (departure of
--   request n modulo ring, µs)
-- ARGV[1] op: 'take' | 'peek' | 'pause' | 'lower' | 'late'
-- ARGV[2] configured requests per second, ARGV[3] guard µs, ARGV[4] argument:
--   pause: milliseconds; lower: requests per second; late: request number (it left before now);
--   0 for the others
-- ARGV[5] '' for Redis TIME, or (tests only) a fake "now" in µs
-- Returns {wait_us, now_us, n}: for 'take', wait 0 when request n is granted now (it leaves
-- at once), else how long until it can be; for 'lower', 1 when the rate was lowered.
arity(1, 0, 5, 0)
local op, configured, guard, arg = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local now = tonumber(ARGV[5])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- A departure is taken to be at most this much after its grant until 'late' says when.
local SOON = 1000
local h = hmget(KEYS[1], 'next_us', 'pause_us', 'rps', 'seq', 'ring')
local rps = configured
local lowered = tonumber(h.rps or '0')
if lowered > 0 and lowered < rps then
  rps = lowered
end
local interval = math.floor(1000000 / rps)
-- A taker this late for its slot keeps the cadence.
local slack = math.min(20000, math.floor(interval / 2))
local seq = tonumber(h.seq or '0')
local ring = tonumber(h.ring or '') or configured
local nxt = tonumber(h.next_us or '0')
local result = {0, now, seq}
local function allowed()
  local at = math.max(nxt, tonumber(h.pause_us or '0'))
  local n = math.min(rps, ring)
  if seq >= n then
    local oldest = tonumber(redis.call('HGET', KEYS[1], 'd' .. ((seq - n) % ring)) or '0')
    at = math.max(at, oldest + 1000000 + guard)
  end
  return at
end
if op == 'take' then
  local at = allowed()
  if now >= at then
    local cadence = now + interval
    if now - nxt <= slack then
      cadence = nxt + interval
    end
    redis.call('HSET', KEYS[1], 'next_us', cadence, 'seq', seq + 1, 'ring', ring, 'd' .. (seq % ring), now + SOON)
  else
    result = {at - now, now, seq}
  end
elseif op == 'peek' then
  result = {math.max(0, allowed() - now), now, seq}
elseif op == 'pause' then
  redis.call('HSET', KEYS[1], 'pause_us', math.max(tonumber(h.pause_us or '0'), now + arg * 1000))
elseif op == 'lower' then
  if arg >= 1 and (lowered == 0 or arg < lowered) and arg < configured then
    redis.call('HSET', KEYS[1], 'rps', arg)
    result = {1, now, seq}
  end
elseif op == 'late' then
  -- Only while request `arg` is still in the ring (a newer one may have its place).
  if arg < seq and arg + ring >= seq then
    redis.call('HSET', KEYS[1], 'd' .. (arg % ring), now)
  end
end
-- Forgotten an hour after the last request: a lowered rate or a pause does not outlive that.
redis.call('PEXPIRE', KEYS[1], 3600000)
return result
