-- unlock.lua: delete a lock only if owner still holds it.
-- KEYS[1] lock key, ARGV[1] owner. Reply 1 if deleted, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
