-- close.lua: remove a lease and return what it had left, exactly once.
-- KEYS[1]  bucket key
-- ARGV[1]  lease id (non-empty)
-- ARGV[2]  now ms (0 = Redis TIME), for the balance in the reply
-- ARGV[3]  orphan TTL ms for a key this call creates (unknown lease)
-- Reply {unspent, already_closed, unknown, spendable balance at now}:
--   the first close moves r:<id> to c:<id> and returns it with
--   already_closed 0; every later close returns the same unspent with
--   already_closed 1. Closing a lease never deposited records it closed
--   with 0 (unknown 1), so a late deposit of it is refused.
local key = KEYS[1]
local id = ARGV[1]
if id == nil or id == '' then
  error('bucket: empty lease id')
end
local now = now_ms(ARGV[2])
local ttl = int(ARGV[3], 'orphan_ttl_ms')

local unspent, already, unknown = 0, 0, 0
local prev = redis.call('HGET', key, 'c:' .. id)
if prev then
  unspent, already = int(prev, 'closed'), 1
else
  local r = redis.call('HGET', key, 'r:' .. id)
  if r then
    unspent = int(r, 'remaining')
    redis.call('HDEL', key, 'r:' .. id, 's:' .. id, 'd:' .. id)
    redis.call('HSET', key, 'c:' .. id, r)
  else
    unknown = 1
    redis.call('HSET', key, 'c:' .. id, '0')
    orphan(key, ttl)
  end
end
local leases = load(key)
local bal = spendable(leases, now)
if already == 0 and unknown == 0 then
  -- A lease closed: the spend summary is written again without it.
  redis.call('HSET', key, SUMMARY, summarize(leases, now))
end
return {unspent, already, unknown, bal}
