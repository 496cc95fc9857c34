-- create: stores a new approval, either pending or (in band, on a first call) already decided.
-- ARGV: id, account, session_id ('' for none), invocation_id, tool_name, risk_level,
--       side_effects (JSON text), arguments_sha256, arguments_preview, ttl_ms, retention_ms,
--       mode ('pending' | 'used' | 'rejected'), user_id, agent_id, arguments ('' for none),
--       decided_by (of an in-band decision: 'in-band' or the client that made it),
--       max_pending (of the account, unexpired), then field/value pairs the record also
--       keeps (its rule, revision, reviewers, members and quorum)
-- KEYS: the record keys (common.lua), then the arguments string.
-- Reply: {'created' | 'exists' | 'full', now_ms, record}
local now = now_ms()
if redis.call('EXISTS', KEYS[1]) == 1 then
  -- Ids are fresh per call, so this is our own create retried after a lost reply.
  return {'exists', ms(now), record()}
end
-- One account's waiting room is bounded: past it, nothing is written.
if ARGV[12] == 'pending' and
   redis.call('ZCOUNT', KEYS[2], '(' .. ms(now), '+inf') >= tonumber(ARGV[17]) then
  return {'full', ms(now), {}}
end
local id, account, invocation = ARGV[1], ARGV[2], ARGV[4]
local expires = now + tonumber(ARGV[10])
redis.call('HSET', KEYS[1],
  'id', id, 'account', account, 'status', 'pending',
  'session_id', ARGV[3], 'invocation_id', invocation, 'tool_name', ARGV[5],
  'risk_level', ARGV[6], 'side_effects', ARGV[7], 'arguments_sha256', ARGV[8],
  'arguments_preview', ARGV[9], 'created_at_ms', ms(now), 'expires_at_ms', ms(expires),
  'user_id', ARGV[13], 'agent_id', ARGV[14])
for i = 18, #ARGV - 1, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
audit('create', id, 'gateway', now, {'invocation_id', invocation, 'tool_name', ARGV[5],
                                     'user_id', ARGV[13], 'agent_id', ARGV[14]})
local mode = ARGV[12]
if mode == 'pending' then
  redis.call('ZADD', KEYS[2], ms(expires), id)
  redis.call('ZADD', KEYS[3], ms(expires), account .. ':' .. id)
elseif mode == 'used' then
  -- Approved in band and run by this very call: it never waits and never expires.
  redis.call('HSET', KEYS[1], 'status', 'used', 'decided_by', ARGV[16],
             'decided_at_ms', ms(now), 'used_at_ms', ms(now), 'used_by', invocation)
  audit('decide', id, ARGV[16], now, {'status', 'approved', 'reason', ''})
  audit('use', id, invocation, now, {'invocation_id', invocation})
else
  redis.call('HSET', KEYS[1], 'status', 'rejected', 'decided_by', ARGV[16],
             'decided_at_ms', ms(now))
  audit('decide', id, ARGV[16], now, {'status', 'rejected', 'reason', ''})
end
-- Kept past its expiry for the retention window, so `get` still answers with its fate.
redis.call('PEXPIREAT', KEYS[1], ms(expires + tonumber(ARGV[11])))
if ARGV[15] ~= '' then
  redis.call('SET', KEYS[5], ARGV[15])
  redis.call('PEXPIREAT', KEYS[5], ms(expires + tonumber(ARGV[11])))
end
return {'created', ms(now), record()}
