-- spend.lua: decide a sequence of spends, each all or nothing, in order.
-- KEYS[1..m]  bucket keys (one hash slot); a key named twice is one bucket
-- ARGV[1]     now ms (0 = Redis TIME)
-- ARGV[2]     orphan TTL ms for a key this call creates (denied counter)
-- ARGV[3]     number of spends
-- then per spend: n (>= 1), and n pairs (key index into KEYS, cost >= 0)
--
-- A lease is spendable at now when start <= now < deadline, it is not
-- closed and it holds tokens. In a spend each key pays its cost from its
-- spendable leases in order of earliest deadline (ties by id), splitting
-- across leases. If any key lacks spendable tokens for its cost (a key
-- named twice in one spend pays both costs), nothing is charged and the
-- cost is added to 'denied' on each key that lacked it; otherwise each key
-- adds its cost to 'admitted'. Later spends see the effect of earlier ones,
-- exactly as if each were its own script call. All writes happen at the
-- end, after every argument was checked: an error leaves no partial state.
--
-- Reply, per spend: failed, then (allowed, balance, earliest, admitted,
-- denied, spent) per key
--   failed     1-based position of the first key that lacked tokens, 0 if none
--   allowed    1 if that key had enough spendable tokens for its cost
--   balance    the key's spendable tokens after the spend
--   earliest   earliest deadline among the key's spendable tokens, 0 if none
--   admitted   the key's admitted counter after the spend
--   denied     the key's denied counter after the spend
--   spent      1 if the key's pool_spent counter is set
local now = now_ms(ARGV[1])
local ttl = int(ARGV[2], 'orphan_ttl_ms')
local nops = int(ARGV[3], 'spends')

local state = {} -- key name -> bucket state
local function get(i)
  local key = KEYS[i]
  if key == nil then
    error('bucket: key index out of range')
  end
  local st = state[key]
  if st == nil then
    local counters = {}
    local leases, exists = load(key, counters)
    local bal, earliest = spendable(leases, now)
    local spent = 0
    if (counters['pool_spent'] or 0) > 0 then
      spent = 1
    end
    st = {key = key, leases = leases, bal = bal, earliest = earliest, exists = exists,
          admitted = 0, denied = 0, base_admitted = counters['admitted'] or 0,
          base_denied = counters['denied'] or 0,
          spent = spent}
    state[key] = st
  end
  return st
end

-- charge takes cost from st's spendable leases, earliest deadline first.
-- The caller checked st.bal >= cost.
local function charge(st, cost)
  if cost == 0 then
    return
  end
  local left = cost
  for _, l in ipairs(st.leases) do
    if left == 0 then
      break
    end
    if l.s <= now and now < l.d and l.r > 0 then
      local take = l.r
      if take > left then
        take = left
      end
      l.r = l.r - take
      l.dirty = true
      left = left - take
    end
  end
  st.admitted = st.admitted + cost
  st.bal, st.earliest = spendable(st.leases, now)
end

local out = {}
local p = 4
for _ = 1, nops do
  local n = int(ARGV[p], 'keys per spend')
  p = p + 1
  if n == 1 then
    -- One key: the common case, without per-spend tables.
    local st = get(int(ARGV[p], 'key index'))
    local c = int(ARGV[p + 1], 'cost')
    p = p + 2
    if c < 0 then
      error('bucket: negative cost')
    end
    local ok = st.bal >= c
    if ok then
      charge(st, c)
    else
      st.denied = st.denied + c
    end
    out[#out + 1] = ok and 0 or 1
    out[#out + 1] = ok and 1 or 0
    out[#out + 1] = st.bal
    out[#out + 1] = st.earliest
    out[#out + 1] = st.base_admitted + st.admitted
    out[#out + 1] = st.base_denied + st.denied
    out[#out + 1] = st.spent
  elseif n > 1 then
    local sts, costs, need = {}, {}, {}
    for j = 1, n do
      local st = get(int(ARGV[p], 'key index'))
      local c = int(ARGV[p + 1], 'cost')
      p = p + 2
      if c < 0 then
        error('bucket: negative cost')
      end
      sts[j], costs[j] = st, c
      need[st] = (need[st] or 0) + c
    end
    local failed = 0
    for j = 1, n do
      if sts[j].bal < need[sts[j]] then
        failed = j
        break
      end
    end
    out[#out + 1] = failed
    if failed ~= 0 then
      for j = 1, n do
        local st = sts[j]
        local ok = st.bal >= need[st]
        if not ok then
          st.denied = st.denied + costs[j]
        end
        out[#out + 1] = ok and 1 or 0
        out[#out + 1] = st.bal
        out[#out + 1] = st.earliest
        out[#out + 1] = st.base_admitted + st.admitted
    out[#out + 1] = st.base_denied + st.denied
        out[#out + 1] = st.spent
      end
    else
      for j = 1, n do
        charge(sts[j], costs[j])
      end
      for j = 1, n do
        out[#out + 1] = 1
        out[#out + 1] = sts[j].bal
        out[#out + 1] = sts[j].earliest
        out[#out + 1] = sts[j].base_admitted + sts[j].admitted
        out[#out + 1] = sts[j].base_denied + sts[j].denied
        out[#out + 1] = sts[j].spent
      end
    end
  else
    error('bucket: empty spend')
  end
end
if ARGV[p] ~= nil then
  error('bucket: trailing arguments')
end

for i = 1, #KEYS do
  local st = state[KEYS[i]]
  if st ~= nil and not st.written then
    st.written = true
    local set = {}
    for _, l in ipairs(st.leases) do
      if l.dirty then
        set[#set + 1] = 'r:' .. l.id
        set[#set + 1] = fmt(l.r)
      end
    end
    -- The counters are written with the leases in one HSET: the script
    -- is atomic, so base + delta is what HINCRBY would have made.
    if st.admitted > 0 then
      set[#set + 1] = 'admitted'
      set[#set + 1] = fmt(st.base_admitted + st.admitted)
    end
    if st.denied > 0 then
      set[#set + 1] = 'denied'
      set[#set + 1] = fmt(st.base_denied + st.denied)
    end
    if #set > 0 then
      redis.call('HSET', st.key, unpack(set))
    end
    if st.denied > 0 and not st.exists then
      orphan(st.key, ttl)
    end
  end
end
return out
