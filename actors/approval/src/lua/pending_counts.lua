-- pending_counts: how many approvals of each account are pending and not yet expired.
-- KEYS: pending zsets. ARGV: none. Reply: {count per key, in KEYS order}
local now = now_ms()
local counts = {}
for i = 1, #KEYS do
  counts[i] = redis.call('ZCOUNT', KEYS[i], '(' .. ms(now), '+inf')
end
return counts
