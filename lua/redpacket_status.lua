-- redcount: status of a red packet (reads only).
-- KEYS[1..2]  meta, shares (see redpacket_create.lua)
-- Reply: {found, total, count, remaining, grabbed_n, grabbed_sum, created_ms, expires_ms}
--   found 0 = unknown or expired (the other fields are 0).
-- (Runs after prelude.lua: int, s, idempotency.)
local m = redis.call('HMGET', KEYS[1], 'total', 'count', 'grabbed_n', 'grabbed_sum',
  'created_ms', 'expires_ms')
if not m[1] then return {0, 0, 0, 0, 0, 0, 0, 0} end
return {1, tonumber(m[1]), tonumber(m[2]), redis.call('LLEN', KEYS[2]), tonumber(m[3]),
  tonumber(m[4]), tonumber(m[5]), tonumber(m[6])}
