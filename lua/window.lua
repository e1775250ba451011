-- window.lua: whether a campaign period may still be kicked, by the rule enqueue.lua applies
-- (prelude.lua, kick_until), on Redis's clock; writes nothing. A kick asks before it writes
-- anything (a fan-out's record, an NDJSON audience's subscribers), and so does a dry run, so a
-- refused kick writes nothing and a dry run says what the kick would; enqueue.lua checks again
-- in the step that enqueues, which is what a kick racing the window's end meets.
--
-- KEYS none. ARGV[1] the period's start (Redis-clock ms), ARGV[2] the kick window's retention
--   seconds.
-- Returns {'open' or 'closed', kick_until, now}.
arity(0, 0, 2, 0)
local now = now_ms()
local closes = kick_until(tonumber(ARGV[1]), tonumber(ARGV[2]))
if now >= closes then
  return {'closed', closes, now}
end
return {'open', closes, now}
