-- slots.lua: a region's slot set of a concurrency limit (at most N held
-- at once, all regions together). The model is package store's memSlots
-- (store/slots.go), rule for rule; the same step table runs on
-- redis-server, miniredis and the in-memory store.
--
-- KEYS[1]  the share hash lh:{<limit>}:slots: seq, n, a, d (the share
--          in force: n slots held, a <= n after a new acquire, until d ms,
--          exclusive), t (the latest instant
--          seen: time never goes back), gen (slot ids issued), and
--          h:<holder> = the holder's slot id
-- KEYS[2]  the held slots lh:{<limit>}:slotz, a sorted set: slot id ->
--          expiry ms. Slot ids are "<holder>~<gen>".
-- ARGV[1]  op: 'install', 'acquire', 'heartbeat' or 'release'
-- ARGV[2]  now ms (0 = Redis TIME)
-- install:   ARGV[3..7] seq (> 0), n (>= 0), admit (0..n), deadline ms,
--            keys' expire-at ms (PEXPIREAT, only ever extended, >= deadline)
--   Reply {status, held}: status 1 installed, 2 stale (the share in force
--   has this seq or a greater one and has not ended), 4 expired (expire-at
--   is not after now: nothing written).
-- acquire:   ARGV[3] holder, ARGV[4] ttl ms (> 0)
--   Reply {allowed, slot id, expires_in ms, retry ms, held, n, deadline}:
--   the holder's slot if it holds one; else a new slot, expiring at
--   min(now + ttl, deadline), when fewer than admit are held and the share has
--   not ended; else denied with retry = until the earliest slot expires
--   (0 with no share in force). n and deadline are 0 with no share in
--   force.
-- heartbeat: ARGV[3] slot id, ARGV[4] ttl ms (> 0)
--   Reply {held, expires_in ms}: a held slot is extended to min(now + ttl,
--   deadline) only while fewer than n other slots expire after it.
-- release:   ARGV[3] slot id
--   Reply {released}: 0 when the slot was not held.
local op = ARGV[1]
local now = now_ms(ARGV[2])
local hk, zk = KEYS[1], KEYS[2]

local function holder_of(id)
  local i = string.find(id, '~[^~]*$')
  if i == nil then
    return ''
  end
  return string.sub(id, 1, i - 1)
end

local h = redis.call('HMGET', hk, 'seq', 'n', 'd', 't', 'a')
local seq, n, d, t = tonumber(h[1]) or 0, tonumber(h[2]) or 0, tonumber(h[3]) or 0, tonumber(h[4]) or 0
local a = tonumber(h[5]) or 0
local exists = h[1] or h[4]

-- advance: never backward; drop the expired slots and their holders.
if now < t then
  now = t
end
local function advance()
  if not exists then
    return
  end
  if now > t then
    redis.call('HSET', hk, 't', fmt(now))
  end
  local gone = redis.call('ZRANGEBYSCORE', zk, '-inf', fmt(now))
  for _, id in ipairs(gone) do
    local hf = 'h:' .. holder_of(id)
    if redis.call('HGET', hk, hf) == id then
      redis.call('HDEL', hk, hf)
    end
  end
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', zk, '-inf', fmt(now))
  end
end

if op == 'install' then
  local nseq = int(ARGV[3], 'seq')
  local nn = int(ARGV[4], 'n')
  local na = int(ARGV[5], 'admit')
  local nd = int(ARGV[6], 'deadline')
  local exp = int(ARGV[7], 'expire_at')
  if nseq <= 0 or nn < 0 or na < 0 or na > nn or nd <= 0 or exp < nd then
    error('slots: bad share')
  end
  if exp <= now then
    advance()
    return {4, redis.call('ZCARD', zk)}
  end
  exists = true
  advance()
  local st = 1
  if seq >= nseq and now < d then
    st = 2
  else
    redis.call('HSET', hk, 'seq', fmt(nseq), 'n', fmt(nn), 'a', fmt(na), 'd', fmt(nd), 't', fmt(now))
  end
  local pt = redis.call('PEXPIRETIME', hk)
  if pt < exp then
    redis.call('PEXPIREAT', hk, fmt(exp))
  end
  if redis.call('EXISTS', zk) == 1 and redis.call('PEXPIRETIME', zk) < exp then
    redis.call('PEXPIREAT', zk, fmt(exp))
  end
  return {st, redis.call('ZCARD', zk)}
end

if op == 'acquire' then
  local holder = ARGV[3]
  local ttl = int(ARGV[4], 'ttl_ms')
  if holder == '' or string.find(holder, '~', 1, true) or ttl <= 0 then
    error('slots: bad acquire')
  end
  if not exists then
    return {0, '', 0, 0, 0, 0, 0}
  end
  advance()
  local sn, sd = n, d
  if now >= d then
    sn, sd = 0, 0
  end
  local mine = redis.call('HGET', hk, 'h:' .. holder)
  if mine then
    local z = redis.call('ZSCORE', zk, mine)
    if z then
      local e = tonumber(z)
      return {1, mine, e - now, 0, redis.call('ZCARD', zk), sn, sd}
    end
  end
  local held = redis.call('ZCARD', zk)
  if sn == 0 or held >= a then
    local retry = 0
    if sn > 0 then
      local first = redis.call('ZRANGE', zk, 0, 0, 'WITHSCORES')
      if #first == 2 then
        retry = tonumber(first[2]) - now
      end
    end
    return {0, '', 0, retry, held, sn, sd}
  end
  local gen = redis.call('HINCRBY', hk, 'gen', 1)
  local id = holder .. '~' .. fmt(gen)
  local e = now + ttl
  if e > d then
    e = d
  end
  redis.call('ZADD', zk, fmt(e), id)
  redis.call('HSET', hk, 'h:' .. holder, id)
  local pt = redis.call('PEXPIRETIME', hk)
  if pt > 0 and redis.call('PEXPIRETIME', zk) < pt then
    redis.call('PEXPIREAT', zk, fmt(pt))
  end
  return {1, id, e - now, 0, held + 1, sn, sd}
end

if op == 'heartbeat' then
  local id = ARGV[3]
  local ttl = int(ARGV[4], 'ttl_ms')
  if id == '' or ttl <= 0 then
    error('slots: bad heartbeat')
  end
  if not exists then
    return {0, 0}
  end
  advance()
  local z = redis.call('ZSCORE', zk, id)
  if not z then
    return {0, 0}
  end
  local e = tonumber(z)
  local target = now + ttl
  if target > d then
    target = d
  end
  if target > e and redis.call('ZCOUNT', zk, '(' .. fmt(e), '+inf') < n then
    e = target
    redis.call('ZADD', zk, 'XX', fmt(e), id)
  end
  return {1, e - now}
end

if op == 'release' then
  local id = ARGV[3]
  if id == '' then
    error('slots: bad release')
  end
  if not exists then
    return {0}
  end
  advance()
  if redis.call('ZREM', zk, id) == 0 then
    return {0}
  end
  local hf = 'h:' .. holder_of(id)
  if redis.call('HGET', hk, hf) == id then
    redis.call('HDEL', hk, hf)
  end
  return {1}
end

error('slots: unknown op ' .. tostring(op))
