-- redcount: quota by GCRA (generic cell rate algorithm): `rate` units per `period`, bursts of
-- up to `burst` at once. One key per subject holds the theoretical arrival time (TAT).
-- Time is Redis's own, in integer microseconds; a unit's emission interval T = period/rate
-- need not be a whole number of microseconds, so the TAT is kept exactly as whole
-- microseconds plus a remainder in 1/rate of a microsecond. Every quantity below that mixes
-- the two is measured in that small unit (u = 1/rate µs), where T = period_ms * 1000 and the
-- burst window is burst * T; the core bounds burst * period_ms so these stay below 2^53.
-- KEYS[1]  hash {t = TAT, whole µs; r = remainder, in u (0 .. rate-1)}
-- ARGV[1]  rate (1 .. 10^7)
-- ARGV[2]  period in ms (1 .. 31622400000, a leap year)
-- ARGV[3]  burst (1 .. 10^9, and burst * period_ms <= 4.5 * 10^12)
-- ARGV[4]  cost of this call (1 .. burst; more than an override allows is denied)
-- ARGV[5]  "1" to peek (report, consume nothing, write nothing), else "0"
-- Reply: {allowed, limit (= burst), remaining, reset_ms, retry_after_ms}
--   remaining: units a call could take at once now (after this call);
--   reset_ms: until the quota is whole again (the TAT reached);
--   retry_after_ms: 0 when allowed, else until a call of this cost passes.
-- KEYS[2]  the subject's override of the burst (prelude.lua: override)
-- A denied call writes nothing. Optional: KEYS[3] + two last ARGV make it idempotent.
-- (Runs after prelude.lua: int, s, idempotency.)

local rate = int('rate', ARGV[1], 1, 10000000)
local period = int('period', ARGV[2], 1, 31622400000)
local burst = int('burst', ARGV[3], 1, 1000000000)
if burst * period > 4500000000000 then
  return error({err = 'ERR redcount: burst * period out of range'})
end
local cost = int('cost', ARGV[4], 1, 1000000000)
local peek = ARGV[5] == '1'

local replay, finish = idempotency(2)
if replay then return replay end
burst = override(KEYS[2], burst, math.min(1000000000, math.floor(4500000000000 / period)))

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local T = period * 1000 -- one emission interval, in u
local W = burst * T     -- the burst window, in u

-- How far the TAT is ahead of now, in u (0 when it is behind: the quota is whole).
local st = redis.call('HMGET', KEYS[1], 't', 'r')
local ahead = 0
local tat, rem = tonumber(st[1]), tonumber(st[2])
if tat and tat >= now then
  ahead = (tat - now) * rate + math.min(math.max(rem or 0, 0), rate - 1)
  -- A server clock that stepped back leaves the TAT further ahead than any burst: cap it.
  if ahead > W then ahead = W end
end

-- Exact integer division of non-negative integers below 2^53 (x / y in doubles can round
-- up to the next integer; a difference that is a multiple of y divides exactly).
local function floor_div(x, y) return (x - x % y) / y end
local function ceil_div(x, y)
  local q = floor_div(x, y)
  if x % y > 0 then q = q + 1 end
  return q
end

local after = ahead + cost * T
local allowed = after <= W
if allowed and not peek then
  ahead = after
  redis.call('HSET', KEYS[1], 't', s(now + floor_div(ahead, rate)), 'r', s(ahead % rate))
  -- Past the TAT the key says nothing a missing key does not: let it go then.
  redis.call('PEXPIRE', KEYS[1], s(math.max(1, ceil_div(ahead, rate * 1000))))
end
local retry = 0
if not allowed then retry = ceil_div(after - W, rate * 1000) end
return finish({allowed and 1 or 0, burst, floor_div(W - ahead, T), ceil_div(ahead, rate * 1000), retry})
