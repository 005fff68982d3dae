-- fallback.lua: admit one request under its limits' fallback modes, all or
-- nothing, atomically: each key's fallback_admitted grows by its cost
-- unless that would pass the key's cap (a local:A fallback's A), in which
-- case nothing is written anywhere. The counter is never above its cap,
-- not even for a moment: a usage report read at any instant is never
-- taken back (the allocator keeps each reporter's highest counts).
-- KEYS[1..n]  bucket keys (one hash slot)
-- ARGV[1]     orphan TTL ms for a key this call creates
-- then per key: cost (>= 0), cap (0 = none), mode counter name ('' = none)
--             (mode_local / mode_open: set, to 0, the first time)
-- Reply {ok, value_1, ..., value_n}: ok 1 admitted (the values after the
-- adds), 0 refused (the values as they are).
local ttl = int(ARGV[1], 'orphan_ttl_ms')
if #ARGV ~= 1 + 3 * #KEYS or #KEYS == 0 then
  error('bucket: fallback arguments')
end
local costs, caps, modes, cur = {}, {}, {}, {}
local need = {} -- a key named twice pays both costs
for i = 1, #KEYS do
  costs[i] = int(ARGV[2 + 3 * (i - 1)], 'cost')
  caps[i] = int(ARGV[3 + 3 * (i - 1)], 'cap')
  modes[i] = ARGV[4 + 3 * (i - 1)]
  if costs[i] < 0 or caps[i] < 0 then
    error('bucket: negative cost or cap')
  end
  if modes[i] ~= '' and modes[i] ~= 'mode_local' and modes[i] ~= 'mode_open' then
    error('bucket: bad mode counter')
  end
  cur[i] = tonumber(redis.call('HGET', KEYS[i], 'fallback_admitted') or '0')
  need[KEYS[i]] = (need[KEYS[i]] or 0) + costs[i]
end
local out = {1}
for i = 1, #KEYS do
  if caps[i] > 0 and cur[i] + need[KEYS[i]] > caps[i] then
    out[1] = 0
  end
end
if out[1] == 0 then
  for i = 1, #KEYS do
    out[#out + 1] = cur[i]
  end
  return out
end
for i = 1, #KEYS do
  local v = redis.call('HINCRBY', KEYS[i], 'fallback_admitted', fmt(costs[i]))
  if modes[i] ~= '' then
    redis.call('HSETNX', KEYS[i], modes[i], '0')
  end
  orphan(KEYS[i], ttl)
  out[#out + 1] = v
end
return out
