-- add.lua: add delta to a named counter of a bucket (e.g. fallback_admitted).
-- KEYS[1]  bucket key
-- ARGV[1]  counter name (no ':'; not admitted/denied: checked by the caller)
-- ARGV[2]  delta
-- ARGV[3]  orphan TTL ms for a key this call creates
-- Reply: the counter's new value.
local key = KEYS[1]
local name = ARGV[1]
if name == nil or name == '' or string.find(name, ':', 1, true) then
  error('bucket: bad counter name')
end
local delta = int(ARGV[2], 'delta')
local ttl = int(ARGV[3], 'orphan_ttl_ms')
local v = redis.call('HINCRBY', key, name, fmt(delta))
orphan(key, ttl)
return v
