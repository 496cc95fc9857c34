-- grant_create: a decision remembers itself as a grant.
-- KEYS: grant hash, the account's grants zset
-- ARGV: id, account, session_id ('' for account scope), tools (JSON), when (JSON), created_by,
--       ttl_ms, uses ('' for no limit), approval_id, retention_ms
-- Reply: {now_ms, record}
local now = now_ms()
local expires = now + tonumber(ARGV[7])
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'account', ARGV[2], 'session_id', ARGV[3],
           'tools', ARGV[4], 'when', ARGV[5], 'created_by', ARGV[6],
           'created_at_ms', ms(now), 'expires_at_ms', ms(expires), 'uses_left', ARGV[8],
           'approval_id', ARGV[9])
redis.call('PEXPIREAT', KEYS[1], ms(expires + tonumber(ARGV[10])))
redis.call('ZADD', KEYS[2], ms(expires), ARGV[1])
return {ms(now), redis.call('HGETALL', KEYS[1])}
