-- common.lua: helpers prepended to every bucket script but the lock's
-- (unlock.lua, extend.lua) by the Go package (one source string per script,
-- loaded with SCRIPT LOAD, run with EVALSHA).
--
-- Rules for every bucket script (they must behave the same on redis-server
-- and on miniredis, which runs gopher-lua):
--   * all state is integers (milliseconds, tokens), below 2^53;
--   * numbers go to redis.call as strings made by fmt() (never tostring,
--     whose float formatting differs between the two);
--   * "now" is ARGV now_ms when it is > 0, else Redis's own TIME;
--   * every iteration order that reaches a reply or a write is sorted.
--
-- Hash layout of one (limit, window) key lh:{<limit>}:w:<window>:
--   r:<lease>  remaining tokens         s:<lease>  start ms (Redis clock)
--   d:<lease>  deadline ms (exclusive)  c:<lease>  closed: unspent at close
--   admitted, denied: cost counters; other names without ':' are counters.
--   z:spend    the spend summary (spend.lua reads it instead of the whole
--              hash): "lo,hi,deadline,rest,head". Every script that changes a
--              lease field (r:, s:, d:, c:) deletes it (forget) or writes
--              it again: close from the leases it reads anyway
--              (summarize), deposit from the summary it finds with the
--              new lease added (deposit.lua's summary_with; from the
--              whole hash when there is none); spend.lua writes it
--              whenever it read the whole hash.
--
-- Reservation records live beside the bucket, in the hash <bucket>:res
-- (RecordsKey in Go, which names it in the scripts' KEYS), never in it:
-- the bucket is read whole (HGETALL) by
-- reserve, close, a deposit that finds no summary and every spend that
-- cannot use the summary,
-- and a hot limit makes a reservation every few hundred ms, a
-- settle-later limit one per request. Fields, per reservation id:
--   v:<res>    tokens taken             w:<res>  its deadline
--   f:<res>    where they came from: "lease=n,..." in the order taken
--   x:<res>    released: tokens it returned
--   g:<res>    a settle-later decision: settle by, ms
--   y:<res>    settled: "actual,estimate,charged,refunded,overrun,debt"
-- The sorted set <bucket>:rexp holds each id by when its record may be
-- dropped (a plain reservation: RECORD_KEEP ms after its deadline, which
-- is at most MAX_RESERVE_LIFE ms after it was made; a settle-later one:
-- RECORD_KEEP ms after its settle-by time); reserve.lua drops a few of
-- those due each time it runs, so the records of a limit stay about as
-- many as it made in the last two minutes. Both keys expire with the
-- bucket. A record an agent of an earlier version wrote into the bucket
-- itself (same fields) is still found there (find_record) and ended
-- there, during a rolling upgrade.

local function int(v, name)
  local n = tonumber(v)
  if n == nil or n ~= math.floor(n) or n > 9007199254740992 or n < -9007199254740992 then
    error('bucket: ' .. name .. ' is not an integer')
  end
  return n
end

local function fmt(n)
  return string.format('%d', n)
end

local function redis_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function now_ms(v)
  local n = int(v, 'now_ms')
  if n > 0 then
    return n
  end
  return redis_now()
end

-- load reads the hash and returns
--   leases: array of {id=, r=, s=, d=}, open (not closed) leases only,
--           sorted by (deadline, id)
--   exists: whether the key held any field
-- and, if counters is a table, fills it with name -> value for every field
-- that is not a lease field.
local function load(key, counters)
  local flat = redis.call('HGETALL', key)
  local byid, all = {}, {}
  for i = 1, #flat, 2 do
    local f = flat[i]
    local p = string.sub(f, 1, 2)
    if p == 'r:' or p == 's:' or p == 'd:' or p == 'c:' then
      local id = string.sub(f, 3)
      local l = byid[id]
      if l == nil then
        l = {id = id}
        byid[id] = l
        all[#all + 1] = l
      end
      l[string.sub(f, 1, 1)] = tonumber(flat[i + 1])
    elseif counters and p ~= 'v:' and p ~= 'w:' and p ~= 'x:' and p ~= 'f:' and p ~= 'g:'
      and p ~= 'y:' and p ~= 'z:' then
      counters[f] = tonumber(flat[i + 1])
    end
  end
  -- Insertion sort by (deadline, id): a bucket holds few leases, and the
  -- order must not depend on HGETALL's order (it differs on miniredis).
  local leases, n = {}, 0
  for _, l in ipairs(all) do
    if l.r ~= nil and l.s ~= nil and l.d ~= nil and l.c == nil then
      local j = n
      while j > 0 and (leases[j].d > l.d or (leases[j].d == l.d and leases[j].id > l.id)) do
        leases[j + 1] = leases[j]
        j = j - 1
      end
      leases[j + 1] = l
      n = n + 1
    end
  end
  return leases, #flat > 0
end

-- usable: lease l holds tokens spendable at now (start <= now <
-- deadline), and lasts until at least from (from <= deadline).
local function usable(l, now, from)
  return l.s <= now and now < l.d and from <= l.d and l.r > 0
end

-- spendable sums the tokens of leases usable at now (and until from, if
-- given) and returns (sum, earliest deadline among them, or 0).
local function spendable(leases, now, from)
  local sum, earliest = 0, 0
  from = from or now
  for _, l in ipairs(leases) do
    if usable(l, now, from) then
      sum = sum + l.r
      if earliest == 0 then
        earliest = l.d
      end
    end
  end
  return sum, earliest
end

-- SUMMARY is the field of the spend summary; NEVER is its "no instant"
-- (2^53: no integer the scripts take is later).
local SUMMARY = 'z:spend'
local NEVER = 9007199254740992

-- summarize returns the spend summary of leases (load's) at now:
-- "lo,hi,deadline,rest,head", where
--   head  the id of the lease a spend at now takes from first (the first
--         usable one in (deadline, id) order), '' when none is usable;
--   deadline  head's deadline (0 when none);
--   rest  the tokens of the other usable leases;
--   lo, hi  the instants between which the set of usable leases is the
--         one at now: for lo <= t < hi, no lease holding tokens starts or
--         reaches its deadline (lo is the latest start or deadline <= now,
--         0 if none; hi the earliest after now, NEVER if none).
-- A lease's usability changes only with time (its start, its deadline) or
-- with its remaining tokens, which only scripts change: while no script
-- but spend.lua touched the leases and lo <= now < hi, a spend at now pays
-- from head first, and the spendable balance is rest plus head's r:.
-- A lease's s: and d: never change once deposited (deposits are
-- idempotent) and closing deletes its r:, so while head's r: is there,
-- head is open, and usable for lo <= now < hi (its start <= lo, its
-- deadline >= hi) whenever r: > 0.
local function summarize(leases, now)
  local lo, hi, d, rest, head = 0, NEVER, 0, 0, ''
  for _, l in ipairs(leases) do
    if l.r > 0 then
      if l.s <= now then
        if l.s > lo then lo = l.s end
      elseif l.s < hi then
        hi = l.s
      end
      if l.d <= now then
        if l.d > lo then lo = l.d end
      elseif l.d < hi then
        hi = l.d
      end
      if usable(l, now, now) then
        if head == '' then
          head, d = l.id, l.d
        else
          rest = rest + l.r
        end
      end
    end
  end
  return fmt(lo) .. ',' .. fmt(hi) .. ',' .. fmt(d) .. ',' .. fmt(rest) .. ',' .. head
end

-- forget deletes key's spend summary: the caller changed a lease field.
local function forget(key)
  redis.call('HDEL', key, SUMMARY)
end

-- other_counters appends to out the number of counters other than admitted
-- and denied, then each one's name and value, sorted by name (the order
-- must not depend on HGETALL's).
local function other_counters(counters, out)
  local names = {}
  for name in pairs(counters) do
    if name ~= 'admitted' and name ~= 'denied' then
      names[#names + 1] = name
    end
  end
  table.sort(names)
  out[#out + 1] = #names
  for _, name in ipairs(names) do
    out[#out + 1] = name
    out[#out + 1] = counters[name]
  end
end

-- orphan gives a key that has no expiry (it was created by this script
-- without a deposit, e.g. a denied counter or a close tombstone) a TTL, so
-- nothing outlives its use. Deposits later extend it with PEXPIREAT.
local function orphan(key, ttl)
  if ttl > 0 and redis.call('PTTL', key) == -1 then
    redis.call('PEXPIRE', key, fmt(ttl))
  end
end

-- MAX_RESERVE_LIFE: a plain reservation's deadline is at most this long
-- after it was made (ms), so its record can go soon after (RECORD_KEEP:
-- how long a record is kept after the reservation or settle-by time ends:
-- a late release or a retried settle still finds it then).
local MAX_RESERVE_LIFE = 60000
local RECORD_KEEP = 60000

-- find_record reads fields (prefixes, e.g. 'v:') of reservation id from
-- the records hash rk or, when it holds none of them, from the bucket
-- key itself (a record an earlier version wrote there). It returns the
-- hash that holds the record (rk if neither does) and the values.
local function find_record(key, rk, id, fields)
  local names = {}
  for i, f in ipairs(fields) do
    names[i] = f .. id
  end
  local first
  for _, h in ipairs({rk, key}) do
    local vals = redis.call('HMGET', h, unpack(names))
    first = first or vals
    for i = 1, #fields do
      if vals[i] then
        return h, vals
      end
    end
  end
  return rk, first
end

-- prune drops the records of up to 64 reservations due at now.
local function prune(rk, ek, now)
  local due = redis.call('ZRANGEBYSCORE', ek, '-inf', fmt(now), 'LIMIT', 0, 64)
  if #due == 0 then
    return
  end
  local names = {}
  for _, id in ipairs(due) do
    for _, f in ipairs({'v:', 'w:', 'f:', 'g:', 'x:', 'y:'}) do
      names[#names + 1] = f .. id
    end
  end
  redis.call('HDEL', rk, unpack(names))
  redis.call('ZREM', ek, unpack(due))
end

-- follow_expiry gives each of keys the bucket key's expiry (a bucket's
-- expiry is only ever extended, so theirs are too).
local function follow_expiry(key, keys)
  local at = redis.call('PEXPIRETIME', key)
  if at <= 0 then
    return
  end
  for _, k in ipairs(keys) do
    if redis.call('PEXPIRETIME', k) ~= at then
      redis.call('PEXPIREAT', k, fmt(at))
    end
  end
end

-- release_reservation ends reservation id (reserved tokens, deadline) of
-- key, its record in hash hk, at now with unspent tokens (0 <= unspent <=
-- reserved) and returns what is spendable again (release.lua says how;
-- settle.lua refunds with it).
local function release_reservation(key, hk, id, unspent, deadline, now)
  local returned = 0
  if unspent > 0 then
    forget(key)
    redis.call('HINCRBY', key, 'released', fmt(unspent))
    local left = unspent
    local from = redis.call('HGET', hk, 'f:' .. id)
    if from then
      for lid, n in string.gmatch(from, '([^=,]+)=(%d+)') do
        if left == 0 then
          break
        end
        local t = tonumber(n)
        if t > left then
          t = left
        end
        local f = redis.call('HMGET', key, 'r:' .. lid, 'd:' .. lid)
        if f[1] and f[2] then -- not closed: back into the lease
          redis.call('HINCRBY', key, 'r:' .. lid, fmt(t))
          if now < tonumber(f[2]) then
            returned = returned + t
          end
          left = left - t
        end
      end
    end
    if left > 0 and now < deadline then
      local sub = 'sub:' .. id
      redis.call('HSET', key, 'r:' .. sub, fmt(left), 's:' .. sub, '0', 'd:' .. sub, fmt(deadline))
      returned = returned + left
    end
  end
  redis.call('HSET', hk, 'x:' .. id, fmt(returned))
  redis.call('HDEL', hk, 'v:' .. id, 'w:' .. id, 'f:' .. id, 'g:' .. id)
  return returned
end

-- check_reservation_id refuses an empty id or one with ':' (the records'
-- field names are <prefix>:<id>).
local function check_reservation_id(id)
  if id == nil or id == '' or string.find(id, ':', 1, true) then
    error('bucket: bad reservation id')
  end
end

-- reserve_tokens is reserve.lua's work (its header says what it does and
-- replies) for reservation id of bucket key, records in rk and their
-- index ek, at now; reservations.lua runs it for each reservation of a
-- batch.
local function reserve_tokens(key, rk, ek, now, id, want, min, last, grace)
  check_reservation_id(id)
  if want < 1 or min < 1 or min > want then
    error('bucket: bad reservation size')
  end
  if last < 0 then
    error('bucket: bad reservation last')
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
end

-- release_tokens is release.lua's work (its header says what it does and
-- replies) for reservation id of bucket key, records in rk, at now;
-- reservations.lua runs it for each release of a batch.
local function release_tokens(key, rk, now, id, unspent)
  check_reservation_id(id)
  local hk, cur = find_record(key, rk, id, {'v:', 'w:', 'x:'})
  if cur[3] then
    return {tonumber(cur[3]), 2}
  end
  if not cur[1] then
    return {0, 3}
  end
  local reserved, deadline = tonumber(cur[1]), tonumber(cur[2])
  if unspent < 0 or unspent > reserved then
    return {0, 4}
  end
  return {release_reservation(key, hk, id, unspent, deadline, now), 1}
end
