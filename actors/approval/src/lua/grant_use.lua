-- grant_use: spends one use of a grant that still covers calls, atomically, so concurrent
-- gateways never spend more uses than it has.
-- KEYS: grant hash. Reply: {'used' | 'gone' | 'revoked' | 'expired' | 'spent', now_ms, record}
local now = now_ms()
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'gone', ms(now), {}}
end
local r = redis.call('HMGET', KEYS[1], 'revoked_at_ms', 'expires_at_ms', 'uses_left')
if r[1] and r[1] ~= '' then
  return {'revoked', ms(now), redis.call('HGETALL', KEYS[1])}
end
if now >= tonumber(r[2]) then
  return {'expired', ms(now), redis.call('HGETALL', KEYS[1])}
end
if r[3] and r[3] ~= '' then
  if tonumber(r[3]) <= 0 then
    return {'spent', ms(now), redis.call('HGETALL', KEYS[1])}
  end
  redis.call('HINCRBY', KEYS[1], 'uses_left', -1)
end
return {'used', ms(now), redis.call('HGETALL', KEYS[1])}
