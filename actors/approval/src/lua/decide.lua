-- decide: an out-of-band decision under the first-decision rule.
-- ARGV: approved ('1' | '0'), decided_by, reason ('' for none), op, expiry member, id
-- Reply: {'not_found' | 'expired' | 'same' | 'conflict' | 'changed', now_ms, record}
local now = now_ms()
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'not_found', ms(now), {}}
end
local r = redis.call('HMGET', KEYS[1], 'status', 'expires_at_ms', 'decided_op')
if r[3] == ARGV[4] then
  -- This very decision, retried after a lost reply: answer as the first time.
  return {'changed', ms(now), record()}
end
local status = effective(r[1], tonumber(r[2]), now)
if status == 'expired' then
  return {'expired', ms(now), record()}
end
local approve = ARGV[1] == '1'
if status ~= 'pending' then
  -- A used approval was approved first, so it counts as approved here.
  local was_approved = status ~= 'rejected'
  if was_approved == approve then
    return {'same', ms(now), record()}
  end
  return {'conflict', ms(now), record()}
end
record_decision(ARGV[6], ARGV[5], approve, ARGV[2], ARGV[3], ARGV[4], now)
return {'changed', ms(now), record()}
