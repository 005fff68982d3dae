-- rate.lua: a region's token bucket under its rate share (bucket limits).
-- The model is lease.TokenBucket (package lease), step for step; the same
-- step table runs on redis-server, miniredis and the in-memory bucket.
--
-- KEYS[1]  rate bucket key lh:{<limit>}:rate ('takes': KEYS[1..m], one slot)
-- ARGV[1]  op: 'install', 'take' or 'takes'
-- ARGV[2]  now ms (0 = Redis TIME)
-- ARGV[3]  orphan TTL ms for a key 'take' creates (denied counter)
-- install: ARGV[4..9] seq (> 0), rate (units per ms, >= 0), burst (tokens,
--          >= 0), unit (units per token, >= 1), deadline ms (exclusive),
--          key expire-at ms (PEXPIREAT; only ever extended, >= deadline)
--   Reply {status, tokens}: status 1 installed, 2 stale (the share in
--   force has this seq or a greater one: nothing changed), 4 expired
--   (expire-at is not after Redis's TIME: nothing written); tokens the
--   whole tokens the bucket holds after the call.
-- take:    ARGV[4] cost (tokens, >= 0), ARGV[5] shadow (1: the limit is
--          in shadow mode, 0 enforced)
--   Reply {allowed, tokens, wait_ms, deadline, admitted, denied,
--   would_deny, would_deny_checks}: tokens after the take, wait_ms how
--   long until the bucket would hold cost (0: now, -1: never under this
--   share), deadline the share's (0: none), admitted and denied the cost
--   counters (tokens) after the take, would_deny and would_deny_checks
--   the shadow counters after it. allowed is 1 (admitted, charged), 0
--   (denied, counted in denied) or 2: in shadow mode, a take the
--   bucket cannot pay (the enforcing decision is a denial) charges
--   nothing and counts its cost in would_deny (and 1 in
--   would_deny_checks) instead of denied; the caller admits it.
-- takes:   ARGV[4] n, then n triples (key index into KEYS, cost >= 0,
--   shadow 0 or 1):
--   the takes decided in order, each as 'take' would, later ones seeing
--   earlier ones; the reply is the n replies of 'take', flattened (8
--   values each). Every argument is checked before anything is written.
--
-- Hash fields: seq, rate, burst, unit, d (the share in force), lvl (units),
-- t (ms: the latest instant seen; time never goes back), admitted, denied,
-- wd and wdc (would_deny, would_deny_checks: shadow mode).
-- Tokens only come from refill, at rate units per ms up to burst*unit,
-- until the deadline; at or after it the bucket is empty. A share installed
-- over one still in force keeps the level (capped at its burst); over an
-- expired one (or none) it starts empty.
local op = ARGV[1]
local now = now_ms(ARGV[2])
local ttl = int(ARGV[3], 'orphan_ttl_ms')
local MAX = 4503599627370496 -- 2^52, lease.MaxBucketUnits

-- load reads a bucket's state.
local function load(key)
  local h = redis.call('HMGET', key, 'seq', 'rate', 'burst', 'unit', 'd', 'lvl', 't', 'admitted', 'denied',
    'wd', 'wdc')
  return {key = key, seq = tonumber(h[1]) or 0, rate = tonumber(h[2]) or 0, burst = tonumber(h[3]) or 0,
          unit = tonumber(h[4]) or 1, d = tonumber(h[5]) or 0, lvl = tonumber(h[6]) or 0,
          t = tonumber(h[7]) or 0, admitted = tonumber(h[8]) or 0, denied = tonumber(h[9]) or 0,
          wd = tonumber(h[10]) or 0, wdc = tonumber(h[11]) or 0}
end

-- advance: bring the bucket to now (never backward); returns max(now, t).
local function advance(st)
  local at = now
  if at < st.t then
    at = st.t
  end
  if st.seq > 0 then
    local e = at
    if st.d < e then
      e = st.d
    end
    if e > st.t then
      local cap = st.burst * st.unit
      local need = cap - st.lvl
      if need <= 0 then
        st.lvl = cap
      elseif st.rate > 0 then
        -- rate*elapsed may exceed 2^53 and round, but rounding is
        -- monotone and need is exact: the comparison is right.
        if st.rate * (e - st.t) >= need then
          st.lvl = cap
        else
          st.lvl = st.lvl + st.rate * (e - st.t)
        end
      end
    end
    if at >= st.d then
      st.lvl = 0
    end
  end
  st.t = at
  return at
end

-- quot returns floor(a/b) for 0 <= a < 2^53, b >= 1, exactly.
local function quot(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function tokens(st)
  if st.seq == 0 then
    return 0
  end
  return quot(st.lvl, st.unit)
end

-- wait: ms until the bucket holds cost tokens (lease.TokenBucket.WaitMs).
local function wait(st, cost)
  if st.seq == 0 or st.t >= st.d or cost > st.burst then
    return -1
  end
  local c = cost * st.unit
  if c <= st.lvl then
    return 0
  end
  if st.rate == 0 then
    return -1
  end
  local w = quot(c - st.lvl + st.rate - 1, st.rate)
  if w >= st.d - st.t then
    return -1
  end
  return w
end

-- take decides one take on st (in memory) and appends its reply to out.
local function take(st, cost, shadow, out)
  local at = advance(st)
  local ok = st.seq > 0 and at < st.d and cost <= st.burst and cost * st.unit <= st.lvl
  local shadowed = not ok and shadow == 1
  if ok then
    st.lvl = st.lvl - cost * st.unit
    st.admitted = st.admitted + cost
    st.dadm = (st.dadm or 0) + cost
  elseif shadowed then
    -- shadow: the enforcing decision is a denial; nothing is charged and
    -- nothing denied, the would-be denial is counted.
    st.wd = st.wd + cost
    st.wdc = st.wdc + 1
    st.dwd = (st.dwd or 0) + cost
    st.dwdc = (st.dwdc or 0) + 1
  else
    st.denied = st.denied + cost
    st.dden = (st.dden or 0) + cost
  end
  local dl = 0
  if st.seq > 0 then
    dl = st.d
  end
  if ok then
    out[#out + 1] = 1
  elseif shadowed then
    out[#out + 1] = 2
  else
    out[#out + 1] = 0
  end
  out[#out + 1] = tokens(st)
  out[#out + 1] = wait(st, cost)
  out[#out + 1] = dl
  out[#out + 1] = st.admitted
  out[#out + 1] = st.denied
  out[#out + 1] = st.wd
  out[#out + 1] = st.wdc
end

-- save writes what takes changed.
local function save(st)
  if (st.dadm or 0) > 0 then
    redis.call('HINCRBY', st.key, 'admitted', fmt(st.dadm))
  end
  if (st.dden or 0) > 0 then
    redis.call('HINCRBY', st.key, 'denied', fmt(st.dden))
  end
  if (st.dwdc or 0) > 0 then
    redis.call('HINCRBY', st.key, 'wd', fmt(st.dwd))
    redis.call('HINCRBY', st.key, 'wdc', fmt(st.dwdc))
  end
  if st.seq > 0 then
    redis.call('HSET', st.key, 'lvl', fmt(st.lvl), 't', fmt(st.t))
  else
    orphan(st.key, ttl) -- only a key with no expiry (just created) gets one
  end
end

if op == 'install' then
  local key = KEYS[1]
  local st = load(key)
  local seq = int(ARGV[4], 'seq')
  local rate = int(ARGV[5], 'rate')
  local burst = int(ARGV[6], 'burst')
  local unit = int(ARGV[7], 'unit')
  local d = int(ARGV[8], 'deadline_ms')
  local expire_at = int(ARGV[9], 'expire_at_ms')
  if seq <= 0 or rate < 0 or rate > MAX or burst < 0 or unit < 1 or unit > MAX or
     burst > math.floor(MAX / unit) or d <= 0 or d > MAX or expire_at < d then
    error('bucket: bad share')
  end
  if expire_at <= redis_now() then
    return {4, tokens(st)}
  end
  local at = advance(st)
  if seq <= st.seq and at < st.d then
    redis.call('HSET', key, 'lvl', fmt(st.lvl), 't', fmt(st.t)) -- time moved forward, as in the model
    return {2, tokens(st)}
  end
  if st.seq == 0 or at >= st.d then
    st.lvl = 0
  end
  st.seq, st.rate, st.burst, st.unit, st.d = seq, rate, burst, unit, d
  if st.lvl > burst * unit then
    st.lvl = burst * unit
  end
  if at >= d then
    st.lvl = 0
  end
  redis.call('HSET', key, 'seq', fmt(seq), 'rate', fmt(rate), 'burst', fmt(burst), 'unit', fmt(unit),
    'd', fmt(d), 'lvl', fmt(st.lvl), 't', fmt(st.t))
  local cur = redis.call('PEXPIRETIME', key)
  if cur == -1 or (cur >= 0 and cur < expire_at) then
    redis.call('PEXPIREAT', key, fmt(expire_at))
  end
  return {1, tokens(st)}
elseif op == 'take' or op == 'takes' then
  local pairs_ = {}
  if op == 'take' then
    pairs_[1] = {1, int(ARGV[4], 'cost'), int(ARGV[5], 'shadow')}
    if ARGV[6] ~= nil then
      error('bucket: trailing arguments')
    end
  else
    local n = int(ARGV[4], 'takes')
    if n < 1 then
      error('bucket: no takes')
    end
    for i = 1, n do
      pairs_[i] = {int(ARGV[2 + 3 * i], 'key index'), int(ARGV[3 + 3 * i], 'cost'), int(ARGV[4 + 3 * i], 'shadow')}
    end
    if ARGV[5 + 3 * n] ~= nil then
      error('bucket: trailing arguments')
    end
  end
  for _, p in ipairs(pairs_) do
    if KEYS[p[1]] == nil then
      error('bucket: key index out of range')
    end
    if p[2] < 0 then
      error('bucket: negative cost')
    end
    if p[3] ~= 0 and p[3] ~= 1 then
      error('bucket: bad shadow flag')
    end
  end
  local states, order, out = {}, {}, {}
  for _, p in ipairs(pairs_) do
    local key = KEYS[p[1]]
    local st = states[key]
    if st == nil then
      st = load(key)
      states[key] = st
      order[#order + 1] = st
    end
    take(st, p[2], p[3], out)
  end
  for _, st in ipairs(order) do
    save(st)
  end
  return out
end
error('bucket: unknown rate op')
