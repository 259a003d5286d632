-- redcount: quota by GCRA (generic cell rate algorithm): `rate` units per `period`, bursts of
-- up to `burst` at once; the theoretical arrival time kept exactly in µs (lib_gcra.lua).
-- KEYS[1]  the TAT (lib_gcra.lua)
-- KEYS[2]  the subject's override of the burst (prelude.lua: override)
-- ARGV[1]  rate (1 .. 10^7)
-- ARGV[2]  period in ms (1 .. 31622400000, a leap year)
-- ARGV[3]  burst (1 .. 10^9, and burst * period_ms <= 4.5 * 10^12)
-- ARGV[4]  cost of this call (1 .. burst; more than an override allows is denied)
-- ARGV[5]  "1" to peek (report, consume nothing, write nothing), else "0"
-- Reply: {allowed, limit (= burst), remaining, reset_ms, retry_after_ms}
--   remaining: units a call could take at once now (after this call);
--   reset_ms: until the quota is whole again (the TAT reached);
--   retry_after_ms: 0 when allowed, else until a call of this cost passes.
-- A denied call writes nothing. Optional: KEYS[3] + two last ARGV make it idempotent.
-- (Runs after prelude.lua, lib_take.lua and lib_gcra.lua.)

return take_quota(gcra_args(1), gcra_eval, 5)
