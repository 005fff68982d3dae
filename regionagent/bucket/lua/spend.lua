-- spend.lua: decide a sequence of spends, each all or nothing, in order.
-- KEYS[1..m]  bucket keys (one hash slot); a key named twice is one bucket
-- ARGV[1]     now ms (0 = Redis TIME)
-- ARGV[2]     orphan TTL ms for a key this call creates (denied counter)
-- ARGV[3]     number of spends
-- then per spend: n (>= 1), and n pairs (key index into KEYS, cost >= 0);
--             a negative index -i names KEYS[i] as counted: an earlier
--             attempt of the same request was denied on that key, and its
--             cost is in 'denied' already
--
-- A lease is spendable at now when start <= now < deadline, it is not
-- closed and it holds tokens. In a spend each key pays its cost from its
-- spendable leases in order of earliest deadline (ties by id), splitting
-- across leases. If any key lacks spendable tokens for its cost (a key
-- named twice in one spend pays both costs), nothing is charged and the
-- cost is added to 'denied' on each key that lacked it; otherwise each key
-- adds its cost to 'admitted'. A counted key adds nothing to 'denied' when
-- it lacks the cost again, and moves its cost from 'denied' to 'admitted'
-- (never below 0) when it pays: a request retried while its region waits
-- for a lease counts once, so admitted + denied is the region's demand,
-- not its attempts. Later spends see the effect of earlier ones,
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

-- A key's state is read one of two ways, with the same results:
--   fast  from the spend summary (common.lua's summarize) and the head
--         lease's remaining tokens: one HMGET of four fields and one
--         HGET, not the whole hash. Used while the summary is there,
--         lo <= now < hi, and the head lease holds tokens. A fast key
--         pays a cost below the head's tokens from the head alone, as the
--         full path would; any other cost, and so every denial, first
--         reads the key in full (upgrade), then decides.
--   full  from the whole hash (load), as every script reads it; the
--         summary is then written again at the end.
-- The fast path never admits a token that is not in the head lease's r:
-- field as it reads it in this call, and never denies: were the summary
-- ever stale (an older agent's script, during a rolling upgrade, does
-- not know it), spends could report a balance that is off or pay from a
-- lease other than the earliest, but never admit more, and never deny a
-- cost the leases hold.
local state = {} -- key name -> bucket state

-- full reads st's key whole.
local function full(st)
  local leases, exists = load(st.key)
  st.fast, st.leases, st.exists = false, leases, exists
  st.bal, st.earliest = spendable(leases, now)
end

-- fast reads st's key from its summary v; false when it cannot.
local function fast(st, v)
  local lo, hi, d, rest, head = string.match(v, '^(%d+),(%d+),(%d+),(%d+),(.*)$')
  if lo == nil or now < tonumber(lo) or now >= tonumber(hi) then
    return false
  end
  local r = 0
  if head ~= '' then
    r = tonumber(redis.call('HGET', st.key, 'r:' .. head))
    if r == nil or r <= 0 then
      return false
    end
  end
  st.fast, st.exists, st.head = true, true, head
  st.r, st.r0, st.bal, st.earliest = r, r, tonumber(rest) + r, tonumber(d)
  return true
end

-- upgrade reads a fast st in full, keeping what this call spent from its
-- head (not written yet).
local function upgrade(st)
  local r = st.r
  full(st)
  for _, l in ipairs(st.leases) do
    if l.id == st.head then
      if l.r ~= r then
        l.r, l.dirty = r, true
      end
      break
    end
  end
  st.bal, st.earliest = spendable(st.leases, now)
end

local function get(i)
  local key = KEYS[i]
  if key == nil then
    error('bucket: key index out of range')
  end
  local st = state[key]
  if st == nil then
    local h = redis.call('HMGET', key, SUMMARY, 'admitted', 'denied', 'pool_spent')
    local spent = 0
    if (tonumber(h[4]) or 0) > 0 then
      spent = 1
    end
    -- Every field a state gets is named here: Lua then sizes the table
    -- once instead of growing it field by field.
    st = {key = key, sum = h[1], admitted = 0, denied = 0, base_admitted = tonumber(h[2]) or 0,
          base_denied = tonumber(h[3]) or 0, spent = spent, fast = false, exists = false, head = '',
          r = 0, r0 = 0, bal = 0, earliest = 0, leases = false, written = false}
    if not (h[1] and fast(st, h[1])) then
      full(st)
    end
    state[key] = st
  end
  return st
end

-- prepare makes st able to decide a spend of need tokens (all of the
-- key's costs in the spend): a fast st decides a need of 0 or one below
-- its head's tokens; any other, a denial included, is read in full
-- first.
local function prepare(st, need)
  if st.fast and need > 0 and need >= st.r then
    upgrade(st)
  end
end

-- charge takes cost from st's spendable leases, earliest deadline first.
-- The caller prepared st and checked st.bal >= cost.
local function charge(st, cost)
  if cost == 0 then
    return
  end
  if st.fast then
    if cost < st.r then
      st.r, st.bal = st.r - cost, st.bal - cost
      st.admitted = st.admitted + cost
      return
    end
    upgrade(st)
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

-- pair reads the (key index, cost) pair at ARGV[p]: the key's state, the
-- cost, and whether the key is counted (a negative index).
local function pair(p)
  local i = int(ARGV[p], 'key index')
  local c = int(ARGV[p + 1], 'cost')
  if c < 0 then
    error('bucket: negative cost')
  end
  if i < 0 then
    return get(-i), c, true
  end
  return get(i), c, false
end

-- uncount moves a counted key's cost, just paid, out of its denied
-- counter (charge added it to admitted).
local function uncount(st, c)
  local m = st.base_denied + st.denied
  if c < m then
    m = c
  end
  st.denied = st.denied - m
end

local out = {}
local p = 4
for _ = 1, nops do
  local n = int(ARGV[p], 'keys per spend')
  p = p + 1
  if n == 1 then
    -- One key: the common case, without per-spend tables.
    local st, c, counted = pair(p)
    p = p + 2
    prepare(st, c)
    local ok = st.bal >= c
    if ok then
      charge(st, c)
      if counted then
        uncount(st, c)
      end
    elseif not counted then
      st.denied = st.denied + c
    end
    local o = #out
    out[o + 1] = ok and 0 or 1
    out[o + 2] = ok and 1 or 0
    out[o + 3] = st.bal
    out[o + 4] = st.earliest
    out[o + 5] = st.base_admitted + st.admitted
    out[o + 6] = st.base_denied + st.denied
    out[o + 7] = st.spent
  elseif n > 1 then
    local sts, costs, counted, need = {}, {}, {}, {}
    for j = 1, n do
      local st, c, cnt = pair(p)
      p = p + 2
      sts[j], costs[j], counted[j] = st, c, cnt
      need[st] = (need[st] or 0) + c
    end
    for j = 1, n do
      prepare(sts[j], need[sts[j]])
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
        if not ok and not counted[j] then
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
        if counted[j] then
          uncount(sts[j], costs[j])
        end
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
    if st.fast then
      if st.r ~= st.r0 then
        set[#set + 1] = 'r:' .. st.head
        set[#set + 1] = fmt(st.r)
      end
    else
      for _, l in ipairs(st.leases) do
        if l.dirty then
          set[#set + 1] = 'r:' .. l.id
          set[#set + 1] = fmt(l.r)
        end
      end
    end
    -- The counters are written with the leases in one HSET: the script
    -- is atomic, so base + delta is what HINCRBY would have made.
    if st.admitted > 0 then
      set[#set + 1] = 'admitted'
      set[#set + 1] = fmt(st.base_admitted + st.admitted)
    end
    if st.denied ~= 0 then
      set[#set + 1] = 'denied'
      set[#set + 1] = fmt(st.base_denied + st.denied)
    end
    -- A key read in full gets its summary back (unless it does not
    -- exist and nothing else is written: no key is created for it).
    if not st.fast and (st.exists or #set > 0) then
      local sum = summarize(st.leases, now)
      if sum ~= st.sum then
        set[#set + 1] = SUMMARY
        set[#set + 1] = sum
      end
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
