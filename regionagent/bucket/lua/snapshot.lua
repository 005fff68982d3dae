-- snapshot.lua: keep a region's newest snapshot of its limits, so that an
-- agent started while the allocator is unreachable enforces them.
-- KEYS[1]  the snapshot key
-- ARGV[1]  the allocator's etcd revision of the snapshot (>= 0)
-- ARGV[2]  when it was taken, ms on the allocator's clock
-- ARGV[3]  the snapshot (bytes)
-- An older snapshot (lower revision; or the same, taken earlier) never
-- replaces a newer one, whatever order replicas write in.
-- Reply 1 stored, 0 kept the newer one there.
local rev = int(ARGV[1], 'revision')
local taken = int(ARGV[2], 'taken_ms')
local cur = redis.call('HMGET', KEYS[1], 'rev', 'taken')
if cur[1] then
  local r, t = tonumber(cur[1]), tonumber(cur[2] or '0')
  if r > rev or (r == rev and t >= taken) then
    return 0
  end
end
redis.call('HSET', KEYS[1], 'rev', ARGV[1], 'taken', ARGV[2], 'data', ARGV[3])
return 1
