-- redcount: give units back to a subject's quota (the work they paid for did not happen),
-- never above the limit, each algorithm in its own terms (lib_give.lua). An admin
-- action: a public refund would undo the limit.
-- KEYS[1]  the quota's state key (as the take script keeps it)
-- KEYS[2]  the subject's override of the size (prelude.lua: override)
-- KEYS[3]  the units lent to shells (quota_lease.lua; a fixed window's only): never given
--          back here, since the shells holding them admit from them without asking Redis
-- ARGV[1]  algorithm: fw, sw, tb or gc
-- ARGV[2]  units to give back (1 .. limit)
-- ARGV[3..] the algorithm's parameters, as its take script takes them
--   fw: limit, window ms · sw: limit, window ms · tb: capacity, refill, interval ms ·
--   gc: rate, period ms, burst
-- Reply: {refunded}: the units given back (fewer when less was in use, or, for a sliding
-- window, past the units of its newest 500 logged calls; 0 for a fixed window whose window
-- has passed, or when nothing is in use).
-- Optional: KEYS[4] + two last ARGV make it idempotent (prelude.lua).
-- (Runs after prelude.lua, lib_fixed.lua, lib_sliding.lua, lib_bucket.lua, lib_gcra.lua and
-- lib_give.lua.)

local key, algo = KEYS[1], ARGV[1]
local units = int('cost', ARGV[2], 1, RUST.quota.MAX_LIMIT)
local args = {fw = fixed_args, sw = sliding_args, tb = bucket_args, gc = gcra_args}
if not args[algo] then
  return error({err = 'ERR redcount: algorithm must be fw, sw, tb or gc'})
end
-- The parameters as the take script reads them, without its cost.
local p = args[algo](3, true)

local replay, finish = idempotency(3, (algo == 'fw' or algo == 'sw') and 4 or 5)
if replay then return replay end

local given, apply
if algo == 'fw' then
  -- Never the units lent to shells: they admit from them without asking Redis.
  local q = fixed_eval(p, key, KEYS[2], now_us)
  local lent = 0
  for _, h in ipairs(redis.call('HVALS', KEYS[3])) do lent = lent + math.max(0, stored(h) or 0) end
  given, apply = fixed_give(p, key, KEYS[2], math.max(0, math.min(units, q.count() - lent)), nil, now_us, q)
elseif algo == 'sw' then
  given, apply = sliding_give(p, key, units, nil, nil, now_us)
elseif algo == 'tb' then
  given, apply = bucket_give(p, key, KEYS[2], units, now_us)
else
  given, apply = gcra_give(p, key, KEYS[2], units, now_us)
end
apply()
-- Nothing given back changes nothing and stores nothing (prelude: idempotency).
return finish({given}, given > 0)
