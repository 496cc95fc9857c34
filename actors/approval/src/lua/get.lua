-- get: the record and the server's "now" in one atomic read, so the status shown is consistent.
-- KEYS: record hash. Reply: {now_ms, record (empty when missing)}
return {ms(now_ms()), redis.call('HGETALL', KEYS[1])}
