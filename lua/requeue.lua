-- requeue.lua: an operator sends a failed delivery again (`dead-letters retry`): it becomes
-- pending with its claims reset, loses its expiry (nothing expires while unsettled), leaves
-- the recent settlements until it settles again, and gets a new stream entry. Only a failed
-- delivery is requeued, or an outcome_unknown one when the operator has checked it was not
-- delivered. Its history (prelude.lua) is kept, with the operator's retry added.
--
-- KEYS[1] stream, KEYS[2] delivery, KEYS[3] counts hash of its campaign period, KEYS[4] recent
--   settlements
-- ARGV[1] delivery id, ARGV[2] '1' to allow outcome_unknown, ARGV[3] who asked (an admin
--   token's name, or `command line`)
-- Returns 'requeued', 'missing', or the state that prevented it.
arity(4, 0, 3, 0)
local state = redis.call('HGET', KEYS[2], 'state')
if not state then
  -- Sent or skipped: settled compactly, never requeued.
  return compacted(KEYS[2]) or 'missing'
end
if state == 'failed' or (state == 'outcome_unknown' and ARGV[2] == '1') then
  local before = redis.call('HGET', KEYS[2], 'history')
  redis.call('HSET', KEYS[2], 'state', 'pending', 'claims', 0,
    'history', kept_history(before, history_line(now_ms(), 'operator', 'retry', ARGV[3], '')))
  -- The waits too (a render hook's, the application's), so the retry has its whole deadline.
  redis.call('HDEL', KEYS[2], 'error', 'reason', 'batch', 'provider_id', 'settled_ms', 'sends', 'lease_owner',
    'lease_until', 'hook_waits', 'hook_wait_since', 'release_ms')
  redis.call('PERSIST', KEYS[2])
  redis.call('HINCRBY', KEYS[3], state, -1)
  redis.call('ZREM', KEYS[4], ARGV[1])
  redis.call('XADD', KEYS[1], '*', 'delivery', ARGV[1])
  return 'requeued'
end
return state
