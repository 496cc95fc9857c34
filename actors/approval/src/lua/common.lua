-- Shared head of every approval script (prepended by store.rs, since Redis scripts cannot
-- import each other). Record scripts take KEYS = {record hash, pending zset of the account,
-- global expiry zset, audit stream of the account}.

-- "Now" comes from the Redis server, never from a node, so every node agrees on expiry.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Lua numbers are doubles; '%.0f' writes a millisecond timestamp without an exponent.
local function ms(n)
  return string.format('%.0f', n)
end

-- One audit entry: who did what to which approval, when. The stream is capped (approximately,
-- which is what makes trimming cheap).
local function audit(event, id, by, at, extra)
  local args = {'XADD', KEYS[4], 'MAXLEN', '~', '100000', '*',
                'event', event, 'id', id, 'by', by, 'at_ms', ms(at)}
  for i = 1, #(extra or {}) do
    args[#args + 1] = extra[i]
  end
  redis.call(unpack(args))
end

-- A pending or approved record past its expiry counts as expired even before the sweeper has
-- written that down; rejected and used records keep their status for good.
local function effective(status, expires_at, now)
  if (status == 'pending' or status == 'approved') and now >= expires_at then
    return 'expired'
  end
  return status
end

-- Records the first decision. Once decided, an approval leaves the pending set; a rejected one
-- can no longer expire into anything, so it leaves the expiry set too.
local function record_decision(id, member, approved, by, reason, op, now)
  local status = 'rejected'
  if approved then status = 'approved' end
  redis.call('HSET', KEYS[1], 'status', status, 'decided_by', by,
             'decided_at_ms', ms(now), 'decided_op', op)
  if reason ~= '' then
    redis.call('HSET', KEYS[1], 'reason', reason)
  end
  redis.call('ZREM', KEYS[2], id)
  if not approved then
    redis.call('ZREM', KEYS[3], member)
  end
  audit('decide', id, by, now, {'status', status, 'reason', reason})
end

-- The record as a flat field/value list (what HGETALL gives), for the reply.
local function record()
  return redis.call('HGETALL', KEYS[1])
end

