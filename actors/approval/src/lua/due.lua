-- due: members of the global expiry set whose time has come, by Redis time.
-- KEYS: expiry zset. ARGV: limit. Reply: members ('<account>:<id>')
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ms(now_ms()), 'LIMIT', '0', ARGV[1])
