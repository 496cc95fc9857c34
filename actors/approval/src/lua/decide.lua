-- decide: an out-of-band decision under the first-decision rule. An approval routed to a
-- reviewer group ('reviewers' set) is decided only by a member the subject names, and needs
-- 'quorum' approvals by distinct members; one rejection by a member rejects it.
-- An approval may carry edited arguments: they replace the arguments it is bound to, and the
-- first hash is kept as 'original_arguments_sha256'. An edit needs the decision that approves
-- it at once (the first, with a quorum of one); an approval decided already refuses it.
-- ARGV: approved ('1' | '0'), decided_by, reason ('' for none), op, expiry member, id,
--       member (the approver the subject names, '' for the plain subject),
--       edited arguments_sha256, preview and arguments text ('' '' '' for no edit),
--       grant_id (the grant an approval remembers itself as, '' for none)
-- KEYS: the record keys (common.lua), then the arguments string.
-- Reply: {'not_found' | 'forbidden' | 'expired' | 'same' | 'conflict' | 'counted' | 'changed'
--         | 'quorum', now_ms, record}
local now = now_ms()
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'not_found', ms(now), {}}
end
local routed = redis.call('HGET', KEYS[1], 'reviewers')
routed = routed and routed ~= ''
if routed then
  local members = redis.call('HGET', KEYS[1], 'members') or ''
  if ARGV[7] == '' or not string.find(',' .. members .. ',', ',' .. ARGV[7] .. ',', 1, true) then
    return {'forbidden', ms(now), record()}
  end
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
local edit = ARGV[8] ~= ''
if status ~= 'pending' then
  if edit then
    -- An edit is a new decision: on a decided approval it is a contrary one.
    return {'conflict', ms(now), record()}
  end
  -- A used approval was approved first, so it counts as approved here.
  local was_approved = status ~= 'rejected'
  if was_approved == approve then
    return {'same', ms(now), record()}
  end
  return {'conflict', ms(now), record()}
end
if edit and tonumber(redis.call('HGET', KEYS[1], 'quorum') or '1') ~= 1 then
  -- Members approve what they saw: an edit would slip arguments past the others.
  return {'quorum', ms(now), record()}
end
if routed then
  local raw = redis.call('HGET', KEYS[1], 'decisions')
  local decisions = {}
  if raw and raw ~= '' then decisions = cjson.decode(raw) end
  for _, d in ipairs(decisions) do
    if d.approver == ARGV[2] then
      if d.approved == approve then return {'same', ms(now), record()} end
      return {'conflict', ms(now), record()}
    end
  end
  decisions[#decisions + 1] = {approver = ARGV[2], approved = approve, at_ms = ms(now),
                               reason = ARGV[3]}
  redis.call('HSET', KEYS[1], 'decisions', cjson.encode(decisions))
  local approvals = 0
  for _, d in ipairs(decisions) do
    if d.approved then approvals = approvals + 1 end
  end
  local quorum = tonumber(redis.call('HGET', KEYS[1], 'quorum') or '1') or 1
  if approve and approvals < quorum then
    audit('vote', ARGV[6], ARGV[2], now, {'status', 'approved', 'reason', ARGV[3]})
    return {'counted', ms(now), record()}
  end
end
if edit then
  local original = redis.call('HGET', KEYS[1], 'arguments_sha256')
  redis.call('HSET', KEYS[1], 'original_arguments_sha256', original, 'arguments_sha256', ARGV[8],
             'arguments_preview', ARGV[9], 'edited', '1')
  -- The edited arguments live as long as the record.
  redis.call('SET', KEYS[5], ARGV[10], 'PXAT', redis.call('PEXPIRETIME', KEYS[1]))
  audit('edit', ARGV[6], ARGV[2], now, {'original_arguments_sha256', original,
                                        'arguments_sha256', ARGV[8]})
end
if approve and ARGV[11] ~= '' then
  redis.call('HSET', KEYS[1], 'grant_id', ARGV[11])
end
record_decision(ARGV[6], ARGV[5], approve, ARGV[2], ARGV[3], ARGV[4], now)
return {'changed', ms(now), record()}
