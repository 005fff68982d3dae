-- deposit.lua: store a lease in a (limit, window) bucket, idempotent by id.
-- KEYS[1]  bucket key
-- ARGV[1]  lease id (non-empty)
-- ARGV[2]  tokens (> 0)
-- ARGV[3]  start ms, Redis clock (>= 0)
-- ARGV[4]  deadline ms, Redis clock, exclusive (> start)
-- ARGV[5]  key expire-at ms, Redis clock (PEXPIREAT; only ever extended)
-- ARGV[6]  now ms (0 = Redis TIME)
-- A new lease first pays the bucket's debt (debt_owed - debt_paid, carried
-- from the window before by settle.lua): what it pays leaves the lease at
-- once and counts as admitted and in debt_paid.
-- Reply {status, spendable balance at now}:
--   status 1 deposited, 2 duplicate (already there, nothing changed),
--          3 closed (refused: the lease was closed before),
--          4 expired (refused: expire-at is not after Redis's TIME; nothing
--            written, since PEXPIREAT in the past would delete the bucket).
local key = KEYS[1]
local id = ARGV[1]
if id == nil or id == '' then
  error('bucket: empty lease id')
end
local tokens = int(ARGV[2], 'tokens')
local start = int(ARGV[3], 'start_ms')
local deadline = int(ARGV[4], 'deadline_ms')
local expire_at = int(ARGV[5], 'expire_at_ms')
local now = now_ms(ARGV[6])
if tokens <= 0 or start < 0 or deadline <= start then
  error('bucket: bad lease')
end

local status
if expire_at <= redis_now() then
  status = 4
elseif redis.call('HEXISTS', key, 'c:' .. id) == 1 then
  status = 3
elseif redis.call('HEXISTS', key, 'r:' .. id) == 1 then
  status = 2
else
  local owed = redis.call('HMGET', key, 'debt_owed', 'debt_paid')
  local pay = 0
  if owed[1] then
    pay = math.min(tokens, tonumber(owed[1]) - (tonumber(owed[2]) or 0))
  end
  if pay > 0 then
    redis.call('HINCRBY', key, 'debt_paid', fmt(pay))
    redis.call('HINCRBY', key, 'admitted', fmt(pay))
  end
  redis.call('HSET', key, 'r:' .. id, fmt(tokens - pay), 's:' .. id, ARGV[3], 'd:' .. id, ARGV[4])
  status = 1
end

if status ~= 4 then
  local cur = redis.call('PEXPIRETIME', key)
  if cur == -1 or (cur >= 0 and cur < expire_at) then
    redis.call('PEXPIREAT', key, ARGV[5])
  end
end

local leases = load(key)
local bal = spendable(leases, now)
if status == 1 then
  -- The leases changed: the spend summary is written again from them (the
  -- next spend need not read the whole hash to rebuild it).
  redis.call('HSET', key, SUMMARY, summarize(leases, now))
end
return {status, bal}
