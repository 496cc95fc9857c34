-- release: the call that used an approval provably never ran (the gateway found no actor for
-- it), so the approval goes back to `approved` for the caller to present again. Only the very
-- invocation that used it can give it back, and only before its expiry; anything else changes
-- nothing, so a stray or forged release can never turn a used approval into a second run.
-- ARGV: invocation_id, op, expiry member, id
-- Reply: {'not_found' | 'not_used' | 'other_call' | 'expired' | 'released', now_ms, record}
local now = now_ms()
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'not_found', ms(now), {}}
end
local invocation, op, member, id = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local r = redis.call('HMGET', KEYS[1], 'status', 'expires_at_ms', 'used_by', 'released_op')
-- This very release, retried after a lost reply: answer as the first time.
if r[4] == op then
  return {'released', ms(now), record()}
end
if r[1] ~= 'used' then
  return {'not_used', ms(now), record()}
end
if r[3] ~= invocation then
  return {'other_call', ms(now), record()}
end
-- Used records never expire by status (see `effective`), so compare the time directly: an
-- approval given back after its time would come back already dead.
local expires = tonumber(r[2])
if now >= expires then
  return {'expired', ms(now), record()}
end
redis.call('HSET', KEYS[1], 'status', 'approved', 'released_op', op)
redis.call('HDEL', KEYS[1], 'used_at_ms', 'used_by', 'used_op')
-- Approved and unused again, so it can expire again: back into the sweeper's set. It was
-- decided before, so it does not go back into the pending set.
redis.call('ZADD', KEYS[3], r[2], member)
audit('released', id, invocation, now, {'invocation_id', invocation})
return {'released', ms(now), record()}
