-- fanout.lua: the record of one campaign period's fan-out over the registry, so that several
-- schedulers (or a scheduler and an operator) fan it out once, and a fan-out that died halfway
-- resumes from its cursors instead of scanning from zero. One key; every call is one step.
--
-- KEYS[1] the fan-out record (hash: state running|done, owner, lease_until, c<p> the HSCAN
--   cursor of partition p's audience hash ('done' when finished), new, duplicates,
--   not_eligible, scanned, pages, runs, started_ms, done_ms)
-- ARGV[1] op, ARGV[2] owner, ARGV[3] lease ms
-- 'acquire': ARGV[4] '1' to start again if done (an operator's kick), ARGV[5] partitions,
--   ARGV[6] retention seconds. Returns {'acquired', resumed ('1'|'0'), c0, c1, ...},
--   {'held', owner} while another holder's lease is live, or {'done'}.
-- 'progress': ARGV[4] partition, ARGV[5] its cursor after this page, ARGV[6] new,
--   ARGV[7] duplicates, ARGV[8] not eligible, ARGV[9] subscribers scanned. Returns 1, or 0
--   if the record is no longer this owner's (its lease ran out and another took over).
-- 'finish': returns 1, or 0 if no longer this owner's.
-- 'rewind' (`mailstream upgrade`; owner and lease unused): ARGV[4] partitions. A fan-out still
--   running starts every partition again from the beginning. Returns 1, or 0 if not running.
local op = ARGV[1]
-- Each op's arguments: ARGV[1..3] and its own.
local args = ({acquire = 6, progress = 9, finish = 3, rewind = 4})[op]
if not args then
  return redis.error_reply('fanout.lua: unknown op ' .. tostring(op))
end
arity(1, 0, args, 0)
local owner, lease = ARGV[2], tonumber(ARGV[3])
local now = now_ms()
local r = hmget(KEYS[1], 'state', 'owner', 'lease_until')
if op == 'acquire' then
  local restart, partitions = ARGV[4] == '1', tonumber(ARGV[5])
  if r.state == 'done' and not restart then
    return {'done'}
  end
  if r.state == 'running' and r.owner ~= owner and tonumber(r.lease_until) > now then
    return {'held', r.owner}
  end
  local resumed = '0'
  if r.state == 'running' then
    resumed = '1'
  else
    redis.call('DEL', KEYS[1])
    for p = 0, partitions - 1 do
      redis.call('HSET', KEYS[1], 'c' .. p, '0')
    end
    redis.call('HSET', KEYS[1], 'new', 0, 'duplicates', 0, 'not_eligible', 0, 'scanned', 0, 'pages', 0,
      'started_ms', now)
  end
  redis.call('HSET', KEYS[1], 'state', 'running', 'owner', owner, 'lease_until', now + lease)
  redis.call('HINCRBY', KEYS[1], 'runs', 1)
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[6]))
  local out = {'acquired', resumed}
  for p = 0, partitions - 1 do
    out[#out + 1] = redis.call('HGET', KEYS[1], 'c' .. p) or '0'
  end
  return out
end
if op == 'rewind' then
  if r.state ~= 'running' then
    return 0
  end
  for p = 0, tonumber(ARGV[4]) - 1 do
    redis.call('HSET', KEYS[1], 'c' .. p, '0')
  end
  return 1
end
if r.state ~= 'running' or r.owner ~= owner then
  return 0
end
if op == 'progress' then
  redis.call('HSET', KEYS[1], 'c' .. ARGV[4], ARGV[5], 'lease_until', now + lease)
  redis.call('HINCRBY', KEYS[1], 'new', tonumber(ARGV[6]))
  redis.call('HINCRBY', KEYS[1], 'duplicates', tonumber(ARGV[7]))
  redis.call('HINCRBY', KEYS[1], 'not_eligible', tonumber(ARGV[8]))
  redis.call('HINCRBY', KEYS[1], 'scanned', tonumber(ARGV[9]))
  redis.call('HINCRBY', KEYS[1], 'pages', 1)
  return 1
end
if op == 'finish' then
  redis.call('HSET', KEYS[1], 'state', 'done', 'done_ms', now)
  redis.call('HDEL', KEYS[1], 'lease_until')
  return 1
end
