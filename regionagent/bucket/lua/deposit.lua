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
local now = int(ARGV[6], 'now_ms')
if tokens <= 0 or start < 0 or deadline <= start then
  error('bucket: bad lease')
end
-- Redis's clock, read once: the expiry check's, and now's when ARGV[6] is 0.
local rnow = redis_now()
if now <= 0 then
  now = rnow
end

-- summary_with returns the spend summary with lease l added (l nil: no
-- lease added), from the summary sum of the leases before (common.lua's
-- summarize, made at an instant t with lo <= t < hi), and the spendable
-- balance at now; nil when sum cannot be used (malformed, not valid at
-- now, or its head lease drained or gone): the caller then reads the
-- whole bucket. It gives exactly what summarize gives for all the leases
-- at now: the leases before summarize the same at now as at t (no lease
-- holding tokens starts or ends between lo and hi), lo and hi are a max
-- and a min over the leases, and l is the head when it comes first in
-- (deadline, id) order, as load sorts them.
local function summary_with(sum, l)
  local lo, hi, d, rest, head = string.match(sum, '^(%d+),(%d+),(%d+),(%d+),(.*)$')
  if lo == nil then
    return nil
  end
  lo, hi, d, rest = tonumber(lo), tonumber(hi), tonumber(d), tonumber(rest)
  if now < lo or now >= hi then
    return nil
  end
  local hr = 0
  if head ~= '' then
    hr = tonumber(redis.call('HGET', key, 'r:' .. head))
    if hr == nil or hr <= 0 then
      return nil
    end
  end
  if l and l.r > 0 then
    if l.s <= now then
      lo = math.max(lo, l.s)
    else
      hi = math.min(hi, l.s)
    end
    if l.d <= now then
      lo = math.max(lo, l.d)
    else
      hi = math.min(hi, l.d)
    end
    if usable(l, now, now) then
      if head ~= '' and (d < l.d or (d == l.d and head < l.id)) then
        rest = rest + l.r
      else
        rest = rest + hr
        head, d, hr = l.id, l.d, l.r
      end
    end
  end
  return fmt(lo) .. ',' .. fmt(hi) .. ',' .. fmt(d) .. ',' .. fmt(rest) .. ',' .. head, rest + hr
end

-- One read for the lease's state, the debt and the summary; and the
-- key's expiry, read before any write (-2: no key yet, so no leases: the
-- summary of none).
local h = redis.call('HMGET', key, 'c:' .. id, 'r:' .. id, 'debt_owed', 'debt_paid', SUMMARY)
local cur = redis.call('PEXPIRETIME', key)
local before = h[5]
if not before and cur == -2 then
  before = '0,' .. fmt(NEVER) .. ',0,0,'
end
local status, sum, bal
if expire_at <= rnow then
  status = 4
elseif h[1] then
  status = 3
elseif h[2] then
  status = 2
else
  status = 1
  local pay = 0
  if h[3] then
    pay = math.max(0, math.min(tokens, tonumber(h[3]) - (tonumber(h[4]) or 0)))
  end
  local l = {id = id, r = tokens - pay, s = start, d = deadline}
  if before then
    sum, bal = summary_with(before, l)
  end
  -- The leases changed: the spend summary is written with them, so the
  -- next spend need not read the whole hash to rebuild it.
  local set = {'r:' .. id, fmt(l.r), 's:' .. id, ARGV[3], 'd:' .. id, ARGV[4]}
  if pay > 0 then
    set[#set + 1] = 'debt_paid'
    set[#set + 1] = fmt((tonumber(h[4]) or 0) + pay)
    redis.call('HINCRBY', key, 'admitted', fmt(pay))
  end
  if sum then
    set[#set + 1] = SUMMARY
    set[#set + 1] = sum
  end
  redis.call('HSET', key, unpack(set))
  if not sum then
    local leases = load(key)
    bal = spendable(leases, now)
    redis.call('HSET', key, SUMMARY, summarize(leases, now))
  end
end
if status ~= 4 and cur < expire_at then
  -- No expiry (-1), or no key before the HSET above made it (-2).
  redis.call('PEXPIREAT', key, ARGV[5])
end
if bal == nil and before then
  sum, bal = summary_with(before, nil)
end
if bal == nil then
  bal = spendable(load(key), now)
end
return {status, bal}
