-- get: the record, its arguments and the server's "now" in one atomic read, so the status
-- shown is consistent.
-- KEYS: record hash, arguments string.
-- Reply: {now_ms, record (empty when missing), arguments (nil when not stored)}
return {ms(now_ms()), redis.call('HGETALL', KEYS[1]), redis.call('GET', KEYS[2])}
