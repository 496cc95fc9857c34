-- pending_ids: ids of an account's pending approvals not yet expired, soonest expiry first.
-- KEYS: pending zset. ARGV: limit. Reply: {now_ms, ids}
local now = now_ms()
return {ms(now), redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ms(now), '+inf',
                            'LIMIT', '0', ARGV[1])}
