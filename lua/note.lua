-- note.lua: write a field on live delivery records once (HSETNX), never creating a record:
-- a delivery settled compactly meanwhile (prelude.lua) has none, and a field written to its
-- key would make a record without a state or an expiry. Used for an application event's
-- body (first writer wins, every later request sends it) and its "may have been taken" mark.
--
-- KEYS: delivery keys. ARGV[1] field; ARGV[1+i] the value for KEYS[i].
-- Returns per key the field's value now (false: no record).
local n = arity(0, 1, 1, 1)
-- Record m's key and its value.
local function member(m)
  return {dkey = KEYS[m], value = ARGV[1 + m]}
end
local out = {}
for i = 1, n do
  local mb = member(i)
  local key = mb.dkey
  if redis.call('EXISTS', key) == 1 then
    redis.call('HSETNX', key, ARGV[1], mb.value)
    out[i] = redis.call('HGET', key, ARGV[1])
  else
    out[i] = false
  end
end
return out
