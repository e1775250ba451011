-- forget.lua: remove a consumer (a past process) from the group, but only if it has nothing
-- pending and has been idle longer than `idle_ms`, checked and done in one step so a consumer
-- that just resumed reading cannot lose entries from the pending list.
--
-- KEYS[1] stream. ARGV[1] group, ARGV[2] consumer, ARGV[3] idle ms.
-- Returns 1 if it was removed, 0 if not.
arity(1, 0, 3, 0)
local consumers = redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
for _, c in ipairs(consumers) do
  local info = {}
  for i = 1, #c, 2 do info[c[i]] = c[i + 1] end
  if info['name'] == ARGV[2] then
    if tonumber(info['pending']) == 0 and tonumber(info['idle']) > tonumber(ARGV[3]) then
      redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
      return 1
    end
    return 0
  end
end
return 0
