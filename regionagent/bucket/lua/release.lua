-- release.lua: end a sub-lease reservation.
-- KEYS[1]  bucket key
-- ARGV[1]  now ms (0 = Redis TIME)
-- ARGV[2]  reservation id
-- ARGV[3]  unspent (0 <= unspent <= reserved)
--
-- The unspent tokens were not admitted: they are added to the 'released'
-- counter (admitted minus released is what was admitted; every counter
-- only grows, so a usage report read at any moment is never above a later
-- one).
-- Before the reservation's deadline they go back to the bucket as a lease
-- of their own ("sub:<id>") with the reservation's deadline, so nobody can
-- spend them later than the leases they came from; after it they are
-- lost to the window (undershoot). Idempotent: a retry returns what the
-- first release returned.
--
-- Reply {returned, status}: status 1 released now, 2 released before,
--   3 unknown reservation (nothing written)
local key = KEYS[1]
local now = now_ms(ARGV[1])
local id = ARGV[2]
if id == nil or id == '' or string.find(id, ':', 1, true) then
  error('bucket: bad reservation id')
end
local unspent = int(ARGV[3], 'unspent')
local cur = redis.call('HMGET', key, 'v:' .. id, 'w:' .. id, 'x:' .. id)
if cur[3] then
  return {tonumber(cur[3]), 2}
end
if not cur[1] then
  return {0, 3}
end
local reserved, deadline = tonumber(cur[1]), tonumber(cur[2])
if unspent < 0 or unspent > reserved then
  error('bucket: unspent out of range')
end
local returned = 0
if unspent > 0 then
  redis.call('HINCRBY', key, 'released', fmt(unspent))
  if now < deadline then
    local sub = 'sub:' .. id
    redis.call('HSET', key, 'r:' .. sub, fmt(unspent), 's:' .. sub, '0', 'd:' .. sub, fmt(deadline))
    returned = unspent
  end
end
redis.call('HSET', key, 'x:' .. id, fmt(returned))
redis.call('HDEL', key, 'v:' .. id, 'w:' .. id)
return {returned, 1}
