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
-- While this key cannot be reached (its node died, until its replica is promoted), each
-- instance paces alone at its share, the rate over the live instances it last saw
-- (src/send/limiter.rs; docs/limiter.md says why the shares never sum past the rate).
-- 'hello' (every heartbeat) keeps the live instances: each writes its stamp and share
-- and learns how many there are. 'back' is an instance's first hello after it paced
-- alone: each of its requests alone of the last second stays out of the shared rate
-- until its own second has passed (ARGV[9]; without that list, the whole share it paced
-- at stays out for `arg` ms, until a second after its last request alone), so the shared
-- rate grows back as they age instead of waiting for the last; and the peers not seen
-- since, who may still pace alone, keep their shares out of it too (`reserved`) until
-- they say hello or could no longer pace alone (`alone_max`).
--
-- KEYS[1] limiter hash: next_us (cadence), interval_us (the interval it was set with), pause_us (no departure before), rps (a lower rate
--   the provider announced), seq (requests granted), ring (ring size), d<n> (departure of
--   request n modulo ring, µs), outage_ms (when an instance last came back from pacing
--   alone), reserved ("<requests/s>:<until ms>,…": shares kept out of the shared rate)
-- KEYS[2] peers hash (KEYS[1]'s name is its hash tag: the same slot): instance id ->
--   "<stamp ms>:<share>:<held ms>[:<ms>,…]", when it last said hello, the requests/s it
--   would pace alone, until when the share it paced alone at is kept out of the shared
--   rate, and (when it said) until when each of its requests alone is, one request each
-- ARGV[1] op: 'take' | 'peek' | 'pause' | 'lower' | 'late' | 'hello' | 'back'
-- ARGV[2] configured requests per second, ARGV[3] guard µs, ARGV[4] argument:
--   pause: milliseconds; lower: requests per second; late: request number (it left before now);
--   back: how long from now its share stays out of the shared rate, ms; 0 for the others
-- ARGV[5] '' for Redis TIME, or (tests only) a fake "now" in µs
-- ARGV[6] hello/back: this instance's id ('' for the others)
-- ARGV[7] hello/back: how long an instance may pace alone after its last hello, ms
-- ARGV[8] back: the share it paced alone at, requests/s ('' for the others)
-- ARGV[9] back: for each of its requests alone still in its second, in how many ms it
--   leaves it ("<ms>,<ms>,…", at most the share; '' for the others)
-- Returns {wait_us, now_us, n}: for 'take', wait 0 when request n is granted now (it leaves
-- at once), else how long until it can be; for 'lower', 1 when the rate was lowered; for
-- 'hello' and 'back', {live instances (this one too), its share (requests/s), reserve}.
arity(2, 0, 9, 0)
local op, configured, guard, arg = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local now = tonumber(ARGV[5])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- A departure is taken to be at most this much after its grant until 'late' says when.
local SOON = 1000
-- Peers silent this long are no longer counted live (ten heartbeats at least).
local PEER_HORIZON_MS = 10000
local h = hmget(KEYS[1], 'next_us', 'pause_us', 'rps', 'seq', 'ring', 'reserved', 'interval_us')
local rps = configured
local lowered = tonumber(h.rps or '0')
if lowered > 0 and lowered < rps then
  rps = lowered
end
-- The shared rate: what peers that may be pacing alone could send is kept out of it.
local team_rps = rps
for share, untl in string.gmatch(h.reserved or '', '(%d+):(%d+)') do
  if now < tonumber(untl) * 1000 then
    rps = rps - tonumber(share)
  end
end
rps = math.max(0, rps)
if rps == 0 and (op == 'take' or op == 'peek') then
  -- Every request of the rate is kept for peers pacing alone: ask again soon.
  return {100000, now, tonumber(h.seq or '0')}
end
local interval = math.floor(1000000 / rps)
-- A taker this late for its slot keeps the cadence.
local slack = math.min(20000, math.floor(interval / 2))
local seq = tonumber(h.seq or '0')
local ring = tonumber(h.ring or '') or configured
local nxt = tonumber(h.next_us or '0')
-- The cadence at the rate of now: the next slot is one interval of today's rate after the
-- last, so a shared rate that grew since (a peer's share no longer kept out) brings it
-- nearer, one that fell pushes it back.
local last_interval = tonumber(h.interval_us or '')
if last_interval and nxt > 0 then
  nxt = nxt - last_interval + interval
end
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
    redis.call('HSET', KEYS[1], 'next_us', cadence, 'interval_us', interval, 'seq', seq + 1, 'ring', ring,
      'd' .. (seq % ring), now + SOON)
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
elseif op == 'hello' or op == 'back' then
  local me, alone_max = ARGV[6], tonumber(ARGV[7])
  local now_ms = math.floor(now / 1000)
  local held, held_share, held_each = 0, 0, ''
  if op == 'back' then
    redis.call('HSET', KEYS[1], 'outage_ms', now_ms)
    held, held_share = now_ms + arg, tonumber(ARGV[8])
    local each = {}
    for ms in string.gmatch(ARGV[9], '%d+') do
      each[#each + 1] = string.format('%d', now_ms + tonumber(ms))
    end
    held_each = table.concat(each, ',')
  end
  local outage = tonumber(redis.call('HGET', KEYS[1], 'outage_ms') or '0')
  local peers = redis.call('HGETALL', KEYS[2])
  local live, reserve, reserved = 1, 0, {}
  local function keep_out(share, untl)
    reserve = reserve + share
    -- string.format, not `..`: Lua writes a number of more than 14 digits as 1.7e+15.
    reserved[#reserved + 1] = string.format('%d:%d', share, untl)
  end
  -- The share an instance paced alone at, kept out after it came back: one request for
  -- each of its requests alone until that one's second has passed, when it said when
  -- they do (`each`); else the whole share until `untl`, a second after its last.
  local function keep_held(share, untl, each)
    if each == '' then
      keep_out(share, untl)
      return
    end
    for u in string.gmatch(each, '%d+') do
      if now_ms < tonumber(u) then
        keep_out(1, tonumber(u))
      end
    end
  end
  for i = 1, #peers, 2 do
    local stamp, share, until_ms, each = string.match(peers[i + 1], '^(%d+):(%d+):(%d+):?([%d,]*)$')
    stamp, share, until_ms = tonumber(stamp), tonumber(share), tonumber(until_ms)
    if peers[i] ~= me then
      if now_ms - stamp > PEER_HORIZON_MS and now_ms - stamp > alone_max and now_ms >= until_ms then
        redis.call('HDEL', KEYS[2], peers[i])
      else
        if now_ms - stamp <= PEER_HORIZON_MS then
          live = live + 1
        end
        if stamp < outage and now_ms - stamp < alone_max then
          -- Not seen since an instance came back from pacing alone: it may pace alone still.
          keep_out(share, stamp + alone_max)
        elseif now_ms < until_ms then
          -- Back from pacing alone less than a second after its last request alone.
          keep_held(share, until_ms, each)
        end
      end
    elseif op == 'hello' and now_ms < until_ms then
      held, held_share, held_each = until_ms, share, each
    end
  end
  if now_ms < held then
    keep_held(held_share, held, held_each)
  end
  local share = math.floor(team_rps / live)
  -- What it would pace alone at next; while its share alone is kept out, at least that.
  local stored = share
  if now_ms < held then
    stored = math.max(share, held_share)
  else
    held = 0
  end
  if held == 0 or held_each == '' then
    redis.call('HSET', KEYS[2], me, string.format('%d:%d:%d', now_ms, stored, held))
  else
    redis.call('HSET', KEYS[2], me, string.format('%d:%d:%d:%s', now_ms, stored, held, held_each))
  end
  redis.call('PEXPIRE', KEYS[2], 3600000)
  redis.call('HSET', KEYS[1], 'reserved', table.concat(reserved, ','))
  result = {live, share, reserve}
elseif op == 'late' then
  -- Only while request `arg` is still in the ring (a newer one may have its place).
  if arg < seq and arg + ring >= seq then
    redis.call('HSET', KEYS[1], 'd' .. (arg % ring), now)
  end
end
-- Forgotten an hour after the last request: a lowered rate or a pause does not outlive that.
redis.call('PEXPIRE', KEYS[1], 3600000)
return result
