-- reserve.lua: take up to `want` tokens of a bucket for one client to
-- spend in process (a sub-lease).
-- KEYS[1]  bucket key
-- KEYS[2]  its reservation records (<bucket>:res, common.lua)
-- KEYS[3]  when each record may be dropped (a sorted set)
-- ARGV[1]  now ms (0 = Redis TIME)
-- ARGV[2]  reservation id (no ':')
-- ARGV[3]  want (>= 1)
-- ARGV[4]  min (1 <= min <= want): below it nothing is taken
-- ARGV[5]  last ms (>= 0, optional): only from leases that last this long
-- ARGV[6]  settle grace ms (>= 0, optional): > 0 makes the reservation a
--          settle-later decision that settle.lua settles until now + it
--
-- Tokens are taken like a spend: from spendable leases, earliest deadline
-- first; with `last`, only from leases that last at least `last` ms more,
-- and nothing (status 0) when those hold fewer than min. A reservation
-- taken from a lease about to end could not be spent in time and would be
-- given back at once; if the lease closed before that release landed (its
-- return to the allocator gone without them), its tokens were lost to the
-- window: TestEndToEnd stranded one chunk of 26 of 600 that way. Checks
-- spend those leases' last moments, as they spend them first anyway. The reservation's
-- deadline is the deadline of the first lease taken from, so it is never
-- later than any lease its tokens came from, and for a plain reservation
-- (no settle grace) at most MAX_RESERVE_LIFE after now, so that its
-- record can be dropped soon (common.lua);
-- what came from which lease is kept (f:<id>, "lease=n,..." in the order
-- taken) so that release.lua can give unspent tokens back to their leases.
-- Taken tokens count as admitted at once (a client that never releases is
-- counted as having spent them all); release.lua subtracts what comes
-- back. A retried reservation id answers as the first call did.
--
-- Reply {granted, deadline, balance, now, status}:
--   status 1 reserved now, 2 replay of an earlier reservation,
--          3 the reservation was already released (nothing taken),
--          0 fewer than min spendable tokens (nothing taken)
local last, grace = 0, 0
if ARGV[5] ~= nil then
  last = int(ARGV[5], 'last')
end
if ARGV[6] ~= nil then
  grace = int(ARGV[6], 'grace')
end
return reserve_tokens(KEYS[1], KEYS[2], KEYS[3], now_ms(ARGV[1]), ARGV[2], int(ARGV[3], 'want'), int(ARGV[4], 'min'),
  last, grace)
