-- redcount: the GCRA quota (generic cell rate algorithm) as functions, shared by
-- quota_gcra.lua and decide.lua: `rate` units per `period`, bursts of up to `burst` at once.
-- One key per subject holds the theoretical arrival time (TAT). Time is Redis's own, in
-- integer microseconds; a unit's emission interval T = period/rate need not be a whole
-- number of microseconds, so the TAT is kept exactly as whole microseconds plus a remainder
-- in 1/rate of a microsecond. Every quantity below that mixes the two is measured in that
-- small unit (u = 1/rate µs), where T = period_ms * 1000 and the burst window is burst * T;
-- the core bounds burst * period_ms so these stay below 2^53.
-- State: KEYS hash {t = TAT, whole µs; r = remainder, in u (0 .. rate-1)}.

-- The parameters at ARGV[a .. a+3]: rate (1 .. 10^7), period in ms (1 .. 31622400000, a
-- leap year), burst (1 .. 10^9, and burst * period_ms <= 4.5 * 10^12), cost (1 .. 10^9;
-- more than the burst in force is denied).
local function gcra_args(a)
  local p = {
    rate = int('rate', ARGV[a], 1, RUST.quota.MAX_GCRA_RATE),
    period = int('period', ARGV[a + 1], 1, RUST.quota.MAX_GCRA_PERIOD_MS),
    burst = int('burst', ARGV[a + 2], 1, RUST.quota.MAX_LIMIT),
    cost = int('cost', ARGV[a + 3], 1, RUST.quota.MAX_LIMIT),
  }
  if p.burst * p.period > RUST.quota.MAX_GCRA_SPAN then
    return error({err = 'ERR redcount: burst * period out of range'})
  end
  return p
end

-- Exact integer division of non-negative integers below 2^53 (x / y in doubles can round
-- up to the next integer; a difference that is a multiple of y divides exactly).
local function floor_div(x, y) return (x - x % y) / y end
local function ceil_div(x, y)
  local q = floor_div(x, y)
  if x % y > 0 then q = q + 1 end
  return q
end

-- Reads the TAT at server time (`clock()`, in µs) and decides; writes nothing. Returns a table as
-- lib_fixed.lua's fixed_eval does: allowed, retry, take(), reply().
--   limit = burst; remaining: units a call could take at once now (after this call);
--   reset_ms: until the quota is whole again (the TAT reached);
--   retry_after_ms: until a call of this cost passes.
local function gcra_eval(p, key, ovr, clock)
  local now = clock()
  local rate = p.rate
  local burst = override(ovr, p.burst, math.min(RUST.quota.MAX_LIMIT, math.floor(RUST.quota.MAX_GCRA_SPAN / p.period)))
  local T = p.period * 1000 -- one emission interval, in u
  local W = burst * T       -- the burst window, in u

  -- How far the TAT is ahead of now, in u (0 when it is behind: the quota is whole).
  local st = redis.call('HMGET', key, 't', 'r')
  local ahead = 0
  -- (Only numbers in redcount's text: anything else is untrusted, as no TAT; prelude: stored.)
  local tat, rem = stored(st[1]), stored(st[2])
  if tat and tat >= now then
    ahead = (tat - now) * rate + math.min(math.max(rem or 0, 0), rate - 1)
    -- A server clock that stepped back leaves the TAT further ahead than any burst: cap it.
    if ahead > W then ahead = W end
  end

  local after = ahead + p.cost * T
  local q = {allowed = after <= W, retry = 0}
  if not q.allowed then q.retry = ceil_div(after - W, rate * 1000) end
  function q.take()
    ahead = after
    redis.call('HSET', key, 't', s(now + floor_div(ahead, rate)), 'r', s(ahead % rate))
    -- Past the TAT the key says nothing a missing key does not: let it go then.
    redis.call('PEXPIRE', key, s(math.max(1, ceil_div(ahead, rate * 1000))))
  end
  function q.reply()
    return {q.allowed and 1 or 0, burst, floor_div(W - ahead, T), ceil_div(ahead, rate * 1000), q.retry}
  end
  return q
end
