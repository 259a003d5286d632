-- redcount: forget one subject's usage of a quota (an admin action): no SCAN.
-- KEYS[1]  the quota's state key
-- KEYS[2]  the units lent to shells and not yet given back (quota_lease.lua; only a fixed
--          window has any): they stay counted, since the shells that hold them admit from
--          them without asking Redis; each lease gives its own back later.
-- Reply: {existed}; 1 when there was usage to forget.
-- (A script rather than a plain DEL so that an Idempotency-Key replay answers the same.)
-- Optional: KEYS[3] + two last ARGV make it idempotent (prelude.lua).
-- (Runs after prelude.lua: int, s, idempotency.)

local replay, finish = idempotency(2, 0)
if replay then return replay end
local held = 0
for _, v in ipairs(redis.call('HVALS', KEYS[2])) do held = held + math.max(0, stored(v) or 0) end
local n
if held > 0 then
  -- The count becomes the units still lent, with its window's end; nothing else to forget
  -- stores nothing.
  local before = redis.call('GET', KEYS[1])
  n = (before and before ~= s(held)) and 1 or 0
  if n == 1 then redis.call('SET', KEYS[1], s(held), 'KEEPTTL') end -- (its key exists: its expiry stays)
else
  n = redis.call('DEL', KEYS[1])
end
return finish({n}, n > 0)
