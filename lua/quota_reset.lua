-- redcount: forget one subject's usage of a quota (an admin action): one DEL, no SCAN.
-- KEYS[1]  the quota's state key
-- Reply: {existed}; 1 when there was usage to forget.
-- (A script rather than a plain DEL so that an Idempotency-Key replay answers the same.)
-- Optional: KEYS[2] + two last ARGV make it idempotent (prelude.lua).
-- (Runs after prelude.lua: int, s, idempotency.)

local replay, finish = idempotency(1, 0)
if replay then return replay end
local existed = redis.call('DEL', KEYS[1])
-- Nothing to forget changes nothing and stores nothing (prelude: idempotency).
if existed == 0 then return {0} end
return finish({existed})
