-- expire: the sweeper's step for one due member of the expiry set. Every approval node sweeps;
-- whoever's ZREM removes the member is the one that expires it and announces it.
-- ARGV: expiry member ('<account>:<id>'), id
-- Reply: {'lost' | 'gone' | 'not_due' | 'settled' | 'expired', now_ms, record}
local now = now_ms()
if redis.call('ZREM', KEYS[3], ARGV[1]) == 0 then
  return {'lost', ms(now), {}}
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  -- Retention ran out before the sweep (retention 0): only the index entries are left.
  redis.call('ZREM', KEYS[2], ARGV[2])
  return {'gone', ms(now), {}}
end
local r = redis.call('HMGET', KEYS[1], 'status', 'expires_at_ms')
if tonumber(r[2]) > now then
  redis.call('ZADD', KEYS[3], r[2], ARGV[1])
  return {'not_due', ms(now), {}}
end
redis.call('ZREM', KEYS[2], ARGV[2])
if r[1] ~= 'pending' and r[1] ~= 'approved' then
  return {'settled', ms(now), {}}
end
redis.call('HSET', KEYS[1], 'status', 'expired', 'expired_at_ms', ms(now))
audit('expire', ARGV[2], 'sweeper', now, {'status', 'expired', 'was', r[1]})
return {'expired', ms(now), record()}
