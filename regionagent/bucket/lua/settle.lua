-- settle.lua: settle a settle-later decision (a reservation made with a
-- settle-by time) with its actual cost.
-- KEYS[1]  bucket key of the decision's window
-- KEYS[2]  bucket key of the next window (where debt is carried)
-- KEYS[3]  KEYS[1]'s reservation records (<bucket>:res, common.lua)
-- ARGV[1]  now ms (0 = Redis TIME)
-- ARGV[2]  decision id (the reservation id)
-- ARGV[3]  actual cost (>= 0)
-- ARGV[4]  1: carry an overrun as debt into KEYS[2]; 0: forgive it
-- ARGV[5]  ttl ms for KEYS[2] when this script creates it (orphan)
--
-- actual <= estimate: the difference is released like release.lua's
-- unspent tokens (a refund: 'released' grows, the tokens go back to the
-- leases they came from while those are open).
-- actual > estimate: the extra counts as admitted in the decision's
-- window at once ('admitted' grows by all of it). It is taken from that
-- window's spendable leases, earliest deadline first, as far as they
-- hold it; the rest is an overrun the window could not absorb: it grows
-- 'settle_overrun' (the window's settlement term, reported to the
-- allocator), and with carry it is owed by the next window: taken now
-- from that window's open leases as far as they hold it ('admitted' and
-- 'debt_paid' of KEYS[2] grow), the rest kept in 'debt_owed' and taken
-- from the next leases deposited there (deposit.lua). What the next
-- window cannot pay is forgiven with it. Every counter only grows.
-- Idempotent by id: a retry answers what the first settle did.
--
-- Reply {status, estimate, charged, refunded, overrun, debt}:
--   charged: extra taken from the window's leases; refunded: tokens
--   given back; overrun: extra beyond them; debt: the part of overrun
--   carried (taken or owed) into the next window.
--   status 1 settled now, 2 settled before with the same actual (the
--          first settle's numbers), 3 unknown decision (never made,
--          released, its window's key is gone, or its record dropped:
--          RECORD_KEEP ms after its settle-by time), 4 the settle-by
--          time has passed, 5 settled before with another actual (the first
--          settle's numbers); nothing written for 2-5
local key, nextkey, rk = KEYS[1], KEYS[2], KEYS[3]
local now = now_ms(ARGV[1])
local id = ARGV[2]
if id == nil or id == '' or string.find(id, ':', 1, true) then
  error('bucket: bad decision id')
end
local actual = int(ARGV[3], 'actual')
local carry = int(ARGV[4], 'carry')
local ttl = int(ARGV[5], 'ttl')
if actual < 0 then
  error('bucket: bad actual')
end
local hk, cur = find_record(key, rk, id, {'v:', 'w:', 'g:', 'y:'})
if cur[4] then
  local a, e, c, r, o, d = string.match(cur[4], '^(%d+),(%d+),(%d+),(%d+),(%d+),(%d+)$')
  local st = 2
  if tonumber(a) ~= actual then
    st = 5
  end
  return {st, tonumber(e), tonumber(c), tonumber(r), tonumber(o), tonumber(d)}
end
if not cur[1] or not cur[3] then
  return {3, 0, 0, 0, 0, 0}
end
local estimate, deadline, settle_by = tonumber(cur[1]), tonumber(cur[2]), tonumber(cur[3])
if now > settle_by then
  return {4, estimate, 0, 0, 0, 0}
end
local charged, refunded, overrun, debt = 0, 0, 0, 0
if actual <= estimate then
  refunded = release_reservation(key, hk, id, estimate - actual, deadline, now)
else
  local extra = actual - estimate
  release_reservation(key, hk, id, 0, deadline, now)
  local set = {}
  for _, l in ipairs(load(key)) do
    if charged == extra then
      break
    end
    if usable(l, now, now) then
      local t = math.min(l.r, extra - charged)
      charged = charged + t
      set[#set + 1] = 'r:' .. l.id
      set[#set + 1] = fmt(l.r - t)
    end
  end
  if #set > 0 then
    redis.call('HSET', key, unpack(set))
    forget(key)
  end
  redis.call('HINCRBY', key, 'admitted', fmt(extra))
  overrun = extra - charged
  if overrun > 0 then
    redis.call('HINCRBY', key, 'settle_overrun', fmt(overrun))
    if carry == 1 then
      debt = overrun
      local paid = 0
      set = {}
      for _, l in ipairs(load(nextkey)) do
        if paid == debt then
          break
        end
        if now < l.d and l.r > 0 then
          local t = math.min(l.r, debt - paid)
          paid = paid + t
          set[#set + 1] = 'r:' .. l.id
          set[#set + 1] = fmt(l.r - t)
        end
      end
      if #set > 0 then
        redis.call('HSET', nextkey, unpack(set))
        forget(nextkey)
      end
      redis.call('HINCRBY', nextkey, 'debt_owed', fmt(debt))
      if paid > 0 then
        redis.call('HINCRBY', nextkey, 'debt_paid', fmt(paid))
        redis.call('HINCRBY', nextkey, 'admitted', fmt(paid))
      end
      orphan(nextkey, ttl)
    end
  end
end
redis.call('HSET', hk, 'y:' .. id, table.concat({fmt(actual), fmt(estimate), fmt(charged), fmt(refunded), fmt(overrun), fmt(debt)}, ','))
return {1, estimate, charged, refunded, overrun, debt}
