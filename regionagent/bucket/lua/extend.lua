-- extend.lua: reset a lock's TTL only if owner still holds it.
-- KEYS[1] lock key, ARGV[1] owner, ARGV[2] ttl ms. Reply 1 if extended, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
