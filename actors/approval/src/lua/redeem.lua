-- redeem: a call presents an approval id, maybe with an in-band decision; check the binding,
-- apply the decision under the first-decision rule, and let at most one call use it.
-- An approval a reviewer edited binds both the call's arguments and the edited ones; a call
-- it lets run gets the edited arguments back, and runs them.
-- ARGV: session_id ('' for none), tool_name, arguments_sha256, invocation_id,
--       decision ('' | '1' | '0'), op, expiry member, id, decided_by (of the decision)
-- KEYS: the record keys (common.lua), then the arguments string.
-- Reply: {'not_found' | 'mismatch' | 'forbidden' | 'expired' | 'conflict' | 'pending' | 'rejected'
--         | 'used' | 'proceed', now_ms, changed ('1' when something was written), record,
--         edited arguments (text; '' unless the approval was edited and the call proceeds)}
local now = now_ms()
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'not_found', ms(now), '0', {}, ''}
end
local r = redis.call('HMGET', KEYS[1], 'status', 'expires_at_ms', 'session_id', 'tool_name',
                     'arguments_sha256', 'used_op', 'decided_op', 'original_arguments_sha256',
                     'edited')
-- The binding comes first: a call it was not granted for learns nothing else and changes nothing.
if r[3] ~= ARGV[1] or r[4] ~= ARGV[2] or (r[5] ~= ARGV[3] and r[8] ~= ARGV[3]) then
  return {'mismatch', ms(now), '0', record(), ''}
end
local function edited()
  if r[9] == '1' then return redis.call('GET', KEYS[5]) or '' end
  return ''
end
local op, member, id = ARGV[6], ARGV[7], ARGV[8]
-- This very call, retried after a lost reply: answer as the first time.
if r[6] == op then
  return {'proceed', ms(now), '1', record(), edited()}
end
if r[7] == op then
  return {'rejected', ms(now), '1', record(), ''}
end
local status = effective(r[1], tonumber(r[2]), now)
local reviewers = redis.call('HGET', KEYS[1], 'reviewers')
if ARGV[5] ~= '' and reviewers and reviewers ~= '' then
  -- A routed approval is its reviewers' to decide, never the caller's.
  return {'forbidden', ms(now), '0', record(), ''}
end
local changed = '0'
if ARGV[5] ~= '' and status ~= 'expired' then
  local approve = ARGV[5] == '1'
  if status == 'pending' then
    record_decision(id, member, approve, ARGV[9], '', op, now)
    changed = '1'
    if approve then status = 'approved' else status = 'rejected' end
  elseif (status ~= 'rejected') ~= approve then
    return {'conflict', ms(now), '0', record(), ''}
  end
end
if status ~= 'approved' then
  return {status, ms(now), changed, record(), ''}
end
redis.call('HSET', KEYS[1], 'status', 'used', 'used_at_ms', ms(now), 'used_by', ARGV[4],
           'used_op', op)
redis.call('ZREM', KEYS[2], id)
redis.call('ZREM', KEYS[3], member)
audit('use', id, ARGV[4], now, {'invocation_id', ARGV[4]})
return {'proceed', ms(now), '1', record(), edited()}
