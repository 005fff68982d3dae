-- release.lua: end a sub-lease reservation.
-- KEYS[1]  bucket key
-- KEYS[2]  its reservation records (<bucket>:res, common.lua)
-- ARGV[1]  now ms (0 = Redis TIME)
-- ARGV[2]  reservation id
-- ARGV[3]  unspent (0 <= unspent <= reserved)
--
-- The unspent tokens were not admitted: they are added to the 'released'
-- counter (admitted minus released is what was admitted; every counter
-- only grows, so a usage report read at any moment is never above a later
-- one).
-- They go back to the leases they came from (f:<id>, earliest deadline
-- first, at most what each gave) while those are not closed: spendable
-- until the lease's own deadline, and returned to the allocator with the
-- lease when it closes, so a sub-lease strands nothing the region could
-- give back. Only the part whose lease is already closed (its return has
-- gone) stays in the bucket as a lease of its own ("sub:<id>") with the
-- reservation's deadline, so nobody can spend it later than the lease it
-- came from; after that deadline it is lost to the window (undershoot).
-- Idempotent: a retry returns what the first release returned.
--
-- Reply {returned, status}: returned is what is spendable again now;
--   status 1 released now, 2 released before, 3 unknown reservation,
--   4 unspent out of range (more than the reservation holds); nothing
--   written for 3 and 4
local key, rk = KEYS[1], KEYS[2]
local now = now_ms(ARGV[1])
local id = ARGV[2]
if id == nil or id == '' or string.find(id, ':', 1, true) then
  error('bucket: bad reservation id')
end
local unspent = int(ARGV[3], 'unspent')
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
