-- grant_revoke: from now on the grant covers nothing, on every node.
-- KEYS: grant hash. Reply: {'not_found' | 'revoked', now_ms, record}
local now = now_ms()
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'not_found', ms(now), {}}
end
local was = redis.call('HGET', KEYS[1], 'revoked_at_ms')
if not was or was == '' then
  redis.call('HSET', KEYS[1], 'revoked_at_ms', ms(now))
end
return {'revoked', ms(now), redis.call('HGETALL', KEYS[1])}
