-- redcount: quota, fixed window (N per window, windows aligned to the Unix epoch).
-- KEYS[1]  the state (lib_fixed.lua)
-- KEYS[2]  the subject's override of the limit (prelude.lua: override)
-- ARGV[1]  limit (1 .. 10^9)
-- ARGV[2]  window in ms (1 .. 10^12)
-- ARGV[3]  cost of this call (1 .. limit; more than an override allows is denied)
-- ARGV[4]  "1" to peek (report what this call would get, consume nothing, write nothing), else "0"
-- Reply: {allowed, limit, remaining, reset_ms, retry_after_ms}
--   reset_ms: until the window ends and remaining is back to limit;
--   retry_after_ms: 0 when allowed, else until a call of this cost can pass.
-- A denied call writes nothing. Optional: KEYS[3] + two last ARGV make it idempotent.
-- (Runs after fast_fixed.lua, which answers the common call first, prelude.lua, lib_take.lua
-- and lib_fixed.lua.)

return take_quota(fixed_args(1), fixed_eval, 4)
