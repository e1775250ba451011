-- health.lua: whether the provider is down, team-wide (every instance of the prefix shares
-- one record). Failures that say nothing about a batch (no connection, a timeout, a 5xx)
-- are counted in a run that any success ends; a batch answered with a 5xx or timed out
-- again right after itself adds nothing (one batch the provider keeps refusing says more
-- about the batch than the provider), while a connection that could not be made or broke
-- always counts. `threshold` of them, the first and the last within `window` ms and at
-- least `span` ms apart, put the provider down: a burst of faults shorter than that (two
-- 5xx and a hang within 114 ms) is not an outage, however many; the run goes on, and a
-- failure once the span has passed, with still no success, puts it down. While down, one
-- request per interval probes it: whoever asks for a probe after the last one's interval
-- gets it. The first success ends it for everyone; so does a minute with nobody asking to
-- probe (no work left to find out with).
--
-- KEYS[1] the provider's health hash (failures, first_ms, last_batch, down_ms, probe_ms)
-- ARGV[1] 'failed', 'succeeded' or 'probe' (reading it is an HGET of down_ms); ARGV[2] threshold; ARGV[3] window ms;
-- ARGV[4] probe interval ms; ARGV[5] the batch that failed ('failed'; '' for a failure no
-- batch can cause: no connection, a broken one); ARGV[6] the shortest span ms
-- Returns {state, down_ms, changed}: state 'up', 'down' or (for 'probe') 'probe' when the
-- caller may send one request now; down_ms since when it is down ('' when up); changed 1
-- when this call put it down or ended it.
arity(1, 0, 6, 0)
local what, threshold, window, interval = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local span = tonumber(ARGV[6])
local now = now_ms()
local h = hmget(KEYS[1], 'failures', 'first_ms', 'down_ms', 'probe_ms', 'last_batch')
local down = h.down_ms
-- Down lasts while someone probes; with nobody asking, it lapses after this long.
local hold = math.max(60000, 10 * interval)
if what == 'succeeded' then
  if h.failures or down then
    redis.call('DEL', KEYS[1])
  end
  return {'up', '', down and 1 or 0}
elseif what == 'failed' then
  if down then
    return {'down', down, 0}
  end
  local failures, first = tonumber(h.failures or '0'), tonumber(h.first_ms or '0')
  if failures == 0 or now - first > window then
    failures, first = 1, now
  elseif ARGV[5] == '' or h.last_batch ~= ARGV[5] then
    failures = failures + 1
  end
  redis.call('HSET', KEYS[1], 'failures', failures, 'first_ms', first, 'last_batch', ARGV[5])
  if failures >= threshold and now - first >= span then
    -- The failure that put it down was the first probe.
    redis.call('HSET', KEYS[1], 'down_ms', now, 'probe_ms', now + interval)
    redis.call('PEXPIRE', KEYS[1], hold)
    return {'down', tostring(now), 1}
  end
  -- A run that no longer counts leaves nothing behind.
  redis.call('PEXPIRE', KEYS[1], window)
  return {'up', '', 0}
elseif what == 'probe' then
  if not down then
    return {'up', '', 0}
  end
  if tonumber(h.probe_ms or '0') > now then
    return {'down', down, 0}
  end
  redis.call('HSET', KEYS[1], 'probe_ms', now + interval)
  redis.call('PEXPIRE', KEYS[1], hold)
  return {'probe', down, 0}
end
return redis.error_reply('health.lua: no call ' .. what)
