-- reserve.lua: take up to `want` tokens of a bucket for one client to
-- spend in process (a sub-lease).
-- KEYS[1]  bucket key
-- KEYS[2]  its reservation records (<bucket>:res, common.lua)
-- KEYS[3]  when each record may be dropped (a sorted set)
-- ARGV[1]  now ms (0 = Redis TIME)
-- ARGV[2]  reservation id (no ':')
-- ARGV[3]  want (>= 1)
-- ARGV[4]  min (1 <= min <= want): below it nothing is taken
-- ARGV[5]  last ms (>= 0, optional): only from leases that last this long
-- ARGV[6]  settle grace ms (>= 0, optional): > 0 makes the reservation a
--          settle-later decision that settle.lua settles until now + it
--
-- Tokens are taken like a spend: from spendable leases, earliest deadline
-- first; with `last`, only from leases that last at least `last` ms more,
-- and nothing (status 0) when those hold fewer than min. A reservation
-- taken from a lease about to end could not be spent in time and would be
-- given back at once; if the lease closed before that release landed (its
-- return to the allocator gone without them), its tokens were lost to the
-- window: TestEndToEnd stranded one chunk of 26 of 600 that way. Checks
-- spend those leases' last moments, as they spend them first anyway. The reservation's
-- deadline is the deadline of the first lease taken from, so it is never
-- later than any lease its tokens came from, and for a plain reservation
-- (no settle grace) at most MAX_RESERVE_LIFE after now, so that its
-- record can be dropped soon (common.lua);
-- what came from which lease is kept (f:<id>, "lease=n,..." in the order
-- taken) so that release.lua can give unspent tokens back to their leases.
-- Taken tokens count as admitted at once (a client that never releases is
-- counted as having spent them all); release.lua subtracts what comes
-- back. A retried reservation id answers as the first call did.
--
-- Reply {granted, deadline, balance, now, status}:
--   status 1 reserved now, 2 replay of an earlier reservation,
--          3 the reservation was already released (nothing taken),
--          0 fewer than min spendable tokens (nothing taken)
local key, rk, ek = KEYS[1], KEYS[2], KEYS[3]
local now = now_ms(ARGV[1])
local id = ARGV[2]
if id == nil or id == '' or string.find(id, ':', 1, true) then
  error('bucket: bad reservation id')
end
local want = int(ARGV[3], 'want')
local min = int(ARGV[4], 'min')
if want < 1 or min < 1 or min > want then
  error('bucket: bad reservation size')
end
local last = 0
if ARGV[5] ~= nil then
  last = int(ARGV[5], 'last')
end
if last < 0 then
  error('bucket: bad reservation last')
end
local grace = 0
if ARGV[6] ~= nil then
  grace = int(ARGV[6], 'grace')
end
if grace < 0 then
  error('bucket: bad settle grace')
end
local leases = load(key)
local bal = spendable(leases, now)
local from_ms, avail = now, bal
if last > 0 then
  from_ms = now + last -- only leases ending at or after it
  avail = spendable(leases, now, from_ms)
end
local _, prev = find_record(key, rk, id, {'v:', 'w:', 'x:'})
if prev[3] then
  return {0, 0, bal, now, 3}
end
if prev[1] then
  return {tonumber(prev[1]), tonumber(prev[2]), bal, now, 2}
end
if avail < min then
  return {0, 0, bal, now, 0}
end
local take = want
if take > avail then
  take = avail
end
local left, deadline = take, 0
local set, from = {}, {}
for _, l in ipairs(leases) do
  if left == 0 then
    break
  end
  if usable(l, now, from_ms) then
    if deadline == 0 then
      deadline = l.d
    end
    local t = l.r
    if t > left then
      t = left
    end
    l.r = l.r - t
    left = left - t
    set[#set + 1] = 'r:' .. l.id
    set[#set + 1] = fmt(l.r)
    from[#from + 1] = l.id .. '=' .. fmt(t)
  end
end
redis.call('HSET', key, unpack(set))
forget(key)
local drop_at
if grace > 0 then
  drop_at = now + grace + RECORD_KEEP
else
  deadline = math.min(deadline, now + MAX_RESERVE_LIFE)
  drop_at = deadline + RECORD_KEEP
end
prune(rk, ek, now)
local rec = {'f:' .. id, table.concat(from, ','), 'v:' .. id, fmt(take), 'w:' .. id, fmt(deadline)}
if grace > 0 then
  rec[#rec + 1] = 'g:' .. id
  rec[#rec + 1] = fmt(now + grace)
end
redis.call('HSET', rk, unpack(rec))
redis.call('ZADD', ek, fmt(drop_at), id)
follow_expiry(key, {rk, ek})
redis.call('HINCRBY', key, 'admitted', fmt(take))
return {take, deadline, bal - take, now, 1}
