-- redcount: forget one subject's usage of a quota (an admin action): one DEL, no SCAN.
-- KEYS[1]  the quota's state key
-- Reply: {existed}; 1 when there was usage to forget.
-- (A script rather than a plain DEL so that an Idempotency-Key replay answers the same.)
-- Optional: KEYS[2] + two last ARGV make it idempotent (prelude.lua).
-- (Runs after prelude.lua: int, s, idempotency.)

local replay, finish = idempotency(1, 0)
if replay then return replay end
-- Nothing to forget stores nothing.
local n = redis.call('DEL', KEYS[1])
return finish({n}, n > 0)
