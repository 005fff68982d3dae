-- balance.lua: read a bucket (no writes).
-- KEYS[1]  bucket key
-- ARGV[1]  now ms (0 = Redis TIME)
-- Reply {spendable, live, earliest, pending, admitted, denied,
--        n_counters, name_1, value_1, ..., n_expired, id_1, remaining_1, ...}:
--   spendable  tokens of leases with start <= now < deadline
--   live       number of such leases (including drained ones)
--   earliest   earliest deadline among spendable tokens, 0 if none
--   pending    tokens of leases not started yet (now < start)
--   counters   other counters than admitted/denied, sorted by name
--   expired    leases with deadline <= now that are not closed yet, sorted
--              by (deadline, id), with their remaining tokens: the agent
--              closes them and returns the tokens.
--   open       then n_open, id_1, remaining_1, start_1, deadline_1, ...:
--              leases with now < deadline (started or pending), sorted by
--              (deadline, id): what the agent holds, lease by lease.
local key = KEYS[1]
local now = now_ms(ARGV[1])
local counters = {}
local leases = load(key, counters)
local bal, earliest = spendable(leases, now)
local live, pending = 0, 0
local expired, open = {}, {}
for _, l in ipairs(leases) do
  if now < l.s then
    pending = pending + l.r
    open[#open + 1] = l
  elseif now < l.d then
    live = live + 1
    open[#open + 1] = l
  else
    expired[#expired + 1] = l
  end
end
local out = {bal, live, earliest, pending, counters['admitted'] or 0, counters['denied'] or 0}
other_counters(counters, out)
out[#out + 1] = #expired
for _, l in ipairs(expired) do
  out[#out + 1] = l.id
  out[#out + 1] = l.r
end
out[#out + 1] = #open
for _, l in ipairs(open) do
  out[#out + 1] = l.id
  out[#out + 1] = l.r
  out[#out + 1] = l.s
  out[#out + 1] = l.d
end
return out
