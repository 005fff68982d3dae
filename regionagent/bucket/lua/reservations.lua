-- reservations.lua: the reservations and releases of one batch of spends
-- (Buckets.SpendBatch), in one call: each op is reserve.lua's or
-- release.lua's work, run in order, each seeing the ops before it, exactly
-- as separate calls would; a call is what costs Redis most, not the work.
-- KEYS     each op's keys in turn: a reservation's bucket, records and
--          their index (reserve.lua's KEYS), a release's bucket and
--          records (release.lua's); on Redis Cluster all in one slot
-- ARGV[1]  now ms (0 = Redis TIME, read once for the whole call)
-- ARGV[2]  n, the number of ops
-- then per op, either
--          'r', reservation id, want, min, last ms, settle grace ms
--          'l', reservation id, unspent
--
-- Reply: n replies in order, each reserve.lua's or release.lua's.
local now = now_ms(ARGV[1])
local n = int(ARGV[2], 'ops')
local out, a, k = {}, 3, 1
for i = 1, n do
  local kind = ARGV[a]
  if kind == 'r' then
    out[i] = reserve_tokens(KEYS[k], KEYS[k + 1], KEYS[k + 2], now, ARGV[a + 1], int(ARGV[a + 2], 'want'),
      int(ARGV[a + 3], 'min'), int(ARGV[a + 4], 'last'), int(ARGV[a + 5], 'grace'))
    a, k = a + 6, k + 3
  elseif kind == 'l' then
    out[i] = release_tokens(KEYS[k], KEYS[k + 1], now, ARGV[a + 1], int(ARGV[a + 2], 'unspent'))
    a, k = a + 3, k + 2
  else
    error('bucket: bad reservation op')
  end
end
return out
