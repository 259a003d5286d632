-- redcount: quota, token bucket with integer refills (no floating-point drift).
-- KEYS[1]  the bucket (lib_bucket.lua)
-- KEYS[2]  the subject's override of the capacity (prelude.lua: override)
-- ARGV[1]  capacity (1 .. 10^9); a new bucket starts full
-- ARGV[2]  tokens added per refill step (1 .. capacity)
-- ARGV[3]  refill step in ms (1 .. 10^12)
-- ARGV[4]  cost of this call (1 .. capacity; more than an override allows is denied)
-- ARGV[5]  "1" to peek (consume nothing, write nothing), else "0"
-- Reply: {allowed, limit, remaining, reset_ms, retry_after_ms}
--   reset_ms: until the bucket is full again; retry_after_ms: 0 when allowed, else until
--   enough tokens for this cost have been added.
-- A denied call writes nothing. Optional: KEYS[3] + two last ARGV make it idempotent.
-- (Runs after prelude.lua, lib_take.lua and lib_bucket.lua.)

return take_quota(bucket_args(1), bucket_eval, 5)
