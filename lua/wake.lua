-- wake.lua: the provider is back: make every batch waiting for a retry due now, so what an
-- outage held back goes out at once instead of at the end of its own backoff. Only batches
-- in state 'retry' (nobody holds them; a held batch's score is its holder's lease) and due
-- later than now move; their tries and deadlines are left as they are.
--
-- KEYS[1] batches zset, KEYS[2..] batch records; ARGV[i - 1] the id of KEYS[i]
-- Returns how many were made due.
local n = arity(1, 1, 0, 1)
-- Batch m's record and id.
local function member(m)
  return {bkey = KEYS[1 + m], id = ARGV[m]}
end
local now = now_ms()
local woken = 0
for m = 1, n do
  local mb = member(m)
  local id = mb.id
  local score = redis.call('ZSCORE', KEYS[1], id)
  if score and tonumber(score) > now and redis.call('HGET', mb.bkey, 'state') == 'retry' then
    redis.call('ZADD', KEYS[1], now, id)
    woken = woken + 1
  end
end
return woken
