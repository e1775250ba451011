-- pause.lua: pause sending on every instance until the pause key expires, only ever
-- lengthening a pause (a daily quota pause must not cut short a monthly one, and a
-- pause set by hand without an expiry stays until `mailstream resume`).
--
-- KEYS[1] pause key. ARGV[1] reason, ARGV[2] milliseconds.
-- Returns 1 if the pause was set or lengthened, 0 if a longer one was already on.
arity(1, 0, 2, 0)
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -1 or ttl >= tonumber(ARGV[2]) then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
