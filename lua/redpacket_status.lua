-- redcount: status of a red packet (reads only).
-- KEYS[1..2]  meta, shares (see redpacket_create.lua)
-- Reply: {found, total, count, remaining, grabbed_n, grabbed_sum, created_ms, expires_ms}
--   found 0 = unknown or expired (the other fields are 0).
-- (Runs after prelude.lua: int, s, idempotency.)
local m = redis.call('HMGET', KEYS[1], 'total', 'count', 'grabbed_n', 'grabbed_sum',
  'created_ms', 'expires_ms')
if not m[1] then return {0, 0, 0, 0, 0, 0, 0, 0} end
-- Every field in the text redcount writes (prelude: stored), else refused, not passed on.
local out = {1, 0, 0, redis.call('LLEN', KEYS[2]), 0, 0, 0, 0}
for i, at in ipairs({2, 3, 5, 6, 7, 8}) do
  local n = stored(m[i] or '0')
  if not n or n < 0 then
    return tampered('the red packet')
  end
  out[at] = n
end
return out
