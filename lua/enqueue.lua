-- enqueue.lua: enqueue deliveries of one partition and one campaign period, each at most once.
-- A delivery's record is named by its natural dedup key (campaign:period:subscriber:target,
-- plus `:<channel>` for a channel other than email), so HSETNX on it is the dedup check, once
-- the period's settled history (prelude.lua) has no entry for it either (a delivery settled
-- sent or skipped keeps no record); the record and its stream entry are written in this one
-- atomic step: a double kick, a
-- retried kick or two daemons kicking at once enqueue once, every channel of a subscriber
-- together. The record has no expiry until it is settled (nothing expires while unsettled). A
-- delivery due later (a campaign sent at each recipient's local hour) waits in its channel's
-- due set, scored by its release time, instead of the stream; the reclaimer releases it
-- (due.lua). The period is listed in the partition's periods index (what /metrics and
-- `mailstream slo` report on), and each channel's counts hash keeps how many were new and how
-- many were duplicates. A channel's first enqueue of the period fixes the period's number of
-- settled-history buckets, for as many deliveries as the partition's audience has subscribers,
-- and records the end of its kick window (`kick_until`). A kick once that window has ended is
-- refused whole, writing nothing: the traces its dedup reads may have expired (prelude.lua,
-- keep_until), so it could send twice.
--
-- KEYS[1] periods index, KEYS[2] the partition's audience; then per channel c (1..n): KEYS[3c]
--   its stream, KEYS[3c+1] its counts hash, KEYS[3c+2] its due set; then per item
--   KEYS[3+3n+i] delivery key: the partition's delivery prefix plus the delivery id
-- ARGV[1] retention seconds, ARGV[2] `campaign:period`, ARGV[3] the prefix's length,
--   ARGV[4] '1' if a release time (ms; 0: now) follows each item's channel, else '0' (all now),
--   ARGV[5] n, ARGV[6] the period's start (Redis-clock ms), ARGV[7] the kick window's retention
--   seconds; then per item: its channel (1..n) [, its release time]
-- Returns {'ok', kick_until, per item 1 if it was enqueued now, 0 if it already was}, or
-- {'closed', kick_until, {}} when the period's kick window has ended (nothing written).
local timed, n = ARGV[4] == '1', tonumber(ARGV[5]) or -1
local per = 1
if timed then
  per = 2
end
local items = arity(2 + 3 * n, 1, 7, per)
-- Item i's key, channel and release time (ms; 0: now).
local function member(i)
  local a = 7 + per * (i - 1)
  return {dkey = KEYS[2 + 3 * n + i], channel = tonumber(ARGV[a + 1]), release = timed and tonumber(ARGV[a + 2]) or 0}
end
local retention, plen = tonumber(ARGV[1]), tonumber(ARGV[3])
local now = now_ms()
local closes = kick_until(tonumber(ARGV[6]), tonumber(ARGV[7]))
for c = 1, n do
  local recorded = recorded_kick_until(KEYS[3 * c + 1])
  if recorded and recorded < closes then
    closes = recorded
  end
end
if now >= closes then
  return {'closed', closes, {}}
end
local result, added, dups, nb, settled = {}, {}, {}, {}, {}
for c = 1, n do
  added[c], dups[c] = 0, 0
end
-- Channel c's bucket count, and whether any of its deliveries of the period settled compactly.
local function history_of(c)
  if not nb[c] then
    local h = hmget(KEYS[3 * c + 1], 'buckets', 'sent', 'skipped')
    nb[c] = tonumber(h.buckets) or buckets(KEYS[3 * c + 1], redis.call('HLEN', KEYS[2]))
    settled[c] = (h.sent or h.skipped) ~= nil
  end
  return nb[c], settled[c]
end
for i = 1, items do
  local item = member(i)
  local dkey, c = item.dkey, item.channel
  local n_buckets, any_settled = history_of(c)
  local kept = false
  if any_settled then
    local _, prefix, h, field = history(dkey)
    kept = redis.call('HEXISTS', prefix .. (h % n_buckets), field) == 1
  end
  if not kept and redis.call('HSETNX', dkey, 'state', 'pending') == 1 then
    local id, release = string.sub(dkey, plen + 1), item.release
    if release > now then
      redis.call('HSET', dkey, 'release_ms', release)
      redis.call('ZADD', KEYS[3 * c + 2], release, id)
    else
      redis.call('XADD', KEYS[3 * c], '*', 'delivery', id)
    end
    added[c] = added[c] + 1
    result[#result + 1] = 1
  else
    dups[c] = dups[c] + 1
    result[#result + 1] = 0
  end
end
local keep = now + retention * 1000
for c = 1, n do
  local counts = KEYS[3 * c + 1]
  if added[c] + dups[c] > 0 then
    redis.call('HSETNX', counts, 'kick_until', closes)
    if added[c] > 0 then
      redis.call('HINCRBY', counts, 'enqueued', added[c])
    end
    if dups[c] > 0 then
      redis.call('HINCRBY', counts, 'duplicates', dups[c])
    end
    local k = keep_until(counts, now, retention)
    redis.call('PEXPIREAT', counts, k)
    if k > keep then
      keep = k
    end
  end
end
list_period(KEYS[1], ARGV[2], keep, now)
return {'ok', closes, result}
