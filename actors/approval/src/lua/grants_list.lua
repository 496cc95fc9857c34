-- grants_list: every grant of an account still kept (expired ones stay for their retention),
-- oldest first; ids whose hash is gone leave the index.
-- KEYS: the account's grants zset. ARGV: the prefix of its grant hashes.
-- Reply: {now_ms, {record, record, …}}
local now = now_ms()
local out = {}
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local record = redis.call('HGETALL', ARGV[1] .. id)
  if #record == 0 then
    redis.call('ZREM', KEYS[1], id)
  else
    out[#out + 1] = record
  end
end
return {ms(now), out}
