-- wake.lua: the provider is back: make every batch waiting for a retry due now, so what an
-- outage held back goes out at once instead of at the end of its own backoff. Only batches
-- in state 'retry' (nobody holds them; a held batch's score is its holder's lease) and due
-- later than now move; their tries and deadlines are left as they are.
--
-- KEYS[1] batches zset, KEYS[2..] batch records; ARGV[i - 1] the id of KEYS[i]
-- Returns how many were made due.
local now = now_ms()
local woken = 0
for i = 2, #KEYS do
  local id = ARGV[i - 1]
  local score = redis.call('ZSCORE', KEYS[1], id)
  if score and tonumber(score) > now and redis.call('HGET', KEYS[i], 'state') == 'retry' then
    redis.call('ZADD', KEYS[1], now, id)
    woken = woken + 1
  end
end
return woken
