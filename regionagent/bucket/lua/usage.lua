-- usage.lua: read a limit's epoch and the counters of some of its windows
-- in one atomic call (no writes), for a usage report.
-- KEYS[1]      the limit's epoch key
-- KEYS[2..n]   bucket keys of the windows
-- Reply {epoch or '' when the key is missing, then per window:
--        admitted, denied, n_counters, name_1, value_1, ...}, counters (the
--        other fields without ':' besides admitted and denied) sorted by name.
local epoch = redis.call('GET', KEYS[1])
if not epoch then
  epoch = ''
end
local out = {epoch}
for i = 2, #KEYS do
  local counters = {}
  load(KEYS[i], counters)
  out[#out + 1] = counters['admitted'] or 0
  out[#out + 1] = counters['denied'] or 0
  other_counters(counters, out)
end
return out
