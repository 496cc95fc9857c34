-- withdraw: the caller cancelled the call that made this approval while it waited for a
-- decision, so the request is withdrawn: rejected, by `decided_by`, with the reason
-- 'withdrawn'. Only the very invocation that made it can withdraw it, and only while it is
-- still pending; anything else changes nothing, so a stray or forged withdrawal can never undo
-- a decision or reject someone else's request.
-- ARGV: invocation_id, op, expiry member, id, decided_by
-- Reply: {'not_found' | 'other_call' | 'not_pending' | 'withdrawn', now_ms, record}
local now = now_ms()
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'not_found', ms(now), {}}
end
local invocation, op, member, id, by = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local r = redis.call('HMGET', KEYS[1], 'status', 'expires_at_ms', 'invocation_id', 'decided_op')
-- This very withdrawal, retried after a lost reply: answer as the first time.
if r[4] == op then
  return {'withdrawn', ms(now), record()}
end
if r[3] ~= invocation then
  return {'other_call', ms(now), record()}
end
if effective(r[1], tonumber(r[2]), now) ~= 'pending' then
  return {'not_pending', ms(now), record()}
end
record_decision(id, member, false, by, 'withdrawn', op, now)
return {'withdrawn', ms(now), record()}
