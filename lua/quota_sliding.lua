-- redcount: quota, sliding window log (exact: no call is counted in two windows or none).
-- KEYS[1]  the log (lib_sliding.lua): O(log n) Redis time per call
-- KEYS[2]  the subject's override of the limit (prelude.lua: override)
-- ARGV[1]  limit (1 .. 10000)
-- ARGV[2]  window in ms (1 .. 10^12)
-- ARGV[3]  cost of this call (1 .. limit; more than an override allows is denied)
-- ARGV[4]  "1" to peek (consume nothing, write nothing), else "0"
-- Reply: {allowed, limit, remaining, reset_ms, retry_after_ms}
--   reset_ms: until every logged call has left the window (0 when none is logged);
--   retry_after_ms: 0 when allowed, else until enough units leave the window for this cost.
-- A denied call writes nothing. Optional: KEYS[3] + two last ARGV make it idempotent.
-- (Runs after prelude.lua, lib_take.lua and lib_sliding.lua.)

return take_quota(sliding_args(1), sliding_eval, 4)
