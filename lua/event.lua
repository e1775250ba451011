-- event.lua: a provider event about one delivery (delivered, opened, bounced, ...) has its
-- effect once: the event id is recorded with SET NX and a TTL in the same step, so ten
-- deliveries of one event change state once. Each event is counted by type in the hour's
-- tally of its partition (for the admin overview's last 24 hours), which expires after a day
-- and an hour (set once, by the hour's first event of each type: NX, so no other event writes it
-- again, to memory or to the AOF). While the delivery keeps its record (not settled yet, or failed or
-- outcome_unknown: prelude.lua), the event is also written on it; a delivery settled sent
-- keeps only its compact entry, and the provider's own log of the email is found by the
-- provider id that entry keeps. An event after the provider accepted the email (it failed
-- it, or delayed it) is also counted in its campaign period's counts, by reason, while that
-- hash exists (a period past its retention is not written again), and its reason is written
-- on the record (`provider_failed_reason`).
--
-- KEYS[1] seen key, KEYS[2] delivery record, KEYS[3] the hour's webhook tally,
-- KEYS[4] the delivery's campaign period counts
-- ARGV[1] event type (e.g. delivered), ARGV[2] seen TTL s, ARGV[3] the period counter this
-- event adds to ('' for none: provider_failed, delivery_delayed), ARGV[4] its reason ('' for none)
-- Returns 1 when written on its record now, 2 when counted only (no record: settled compactly,
-- or expired), 0 for a repeat.
arity(4, 0, 4, 0)
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', tonumber(ARGV[2])) then
  return 0
end
if redis.call('HINCRBY', KEYS[3], ARGV[1], 1) == 1 then
  redis.call('EXPIRE', KEYS[3], 90000, 'NX')
end
local counter, reason = ARGV[3], ARGV[4]
if counter ~= '' and redis.call('EXISTS', KEYS[4]) == 1 then
  redis.call('HINCRBY', KEYS[4], counter, 1)
  if reason ~= '' then
    redis.call('HINCRBY', KEYS[4], counter .. ':' .. reason, 1)
  end
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  return 2
end
redis.call('HSET', KEYS[2], 'ev_' .. ARGV[1], now_ms())
redis.call('HINCRBY', KEYS[2], 'events', 1)
if counter == 'provider_failed' and reason ~= '' then
  redis.call('HSET', KEYS[2], 'provider_failed_reason', reason)
end
return 1
