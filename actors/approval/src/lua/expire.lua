-- expire: the sweeper's step for one due member of the expiry set. Every approval node sweeps;
-- whoever's ZREM removes the member is the one that expires it and announces it.
-- A pending approval whose rule escalates ('escalate_to') goes, once, to that group instead,
-- with a new deadline as long as the first.
-- KEYS: the record keys (common.lua), then the arguments string.
-- ARGV: expiry member ('<account>:<id>'), id, retention_ms
-- Reply: {'lost' | 'gone' | 'not_due' | 'settled' | 'escalated' | 'expired', now_ms, record}
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
if r[1] == 'pending' then
  local e = redis.call('HMGET', KEYS[1], 'escalate_to', 'escalated', 'created_at_ms',
                       'escalate_members')
  if e[1] and e[1] ~= '' and not e[2] then
    local expires = now + (tonumber(r[2]) - tonumber(e[3]))
    redis.call('HSET', KEYS[1], 'reviewers', e[1], 'members', e[4] or '', 'escalated', '1',
               'expires_at_ms', ms(expires), 'decisions', '')
    redis.call('ZADD', KEYS[2], ms(expires), ARGV[2])
    redis.call('ZADD', KEYS[3], ms(expires), ARGV[1])
    local keep = ms(expires + tonumber(ARGV[3]))
    redis.call('PEXPIREAT', KEYS[1], keep)
    if redis.call('EXISTS', KEYS[5]) == 1 then
      redis.call('PEXPIREAT', KEYS[5], keep)
    end
    audit('escalate', ARGV[2], 'sweeper', now, {'reviewers', e[1]})
    return {'escalated', ms(now), record()}
  end
end
redis.call('HSET', KEYS[1], 'status', 'expired', 'expired_at_ms', ms(now))
audit('expire', ARGV[2], 'sweeper', now, {'status', 'expired', 'was', r[1]})
return {'expired', ms(now), record()}
