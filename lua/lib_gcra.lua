-- redcount: the GCRA quota (generic cell rate algorithm) as functions, shared by
-- quota_gcra.lua, decide.lua, quota_refund.lua and the reservation scripts: `rate` units per
-- `period`, bursts of up to `burst` at once.
-- One key per subject holds the theoretical arrival time (TAT). Time is Redis's own, in
-- integer microseconds; a unit's emission interval T = period/rate need not be a whole
-- number of microseconds, so the TAT is kept exactly as whole microseconds plus a remainder
-- in 1/rate of a microsecond. Every quantity below that mixes the two is measured in that
-- small unit (u = 1/rate µs), where T = period_ms * 1000 and the burst window is burst * T;
-- the core bounds burst * period_ms so these stay below 2^53.
-- State: KEYS hash {t = TAT, whole µs; r = remainder, in u (0 .. rate-1); d = units of debt
-- the TAT may stand beyond the burst window, present only while it does}. A reservation's
-- overrun charged as debt moves the TAT past the burst window (by at most the policy's
-- max_debt, recorded as d, so a reader tells it from a server clock that stepped back);
-- units given back move it back, never before now.

-- The parameters at ARGV[a .. a+3]: rate (1 .. 10^7), period in ms (1 .. 31622400000, a
-- leap year), burst (1 .. 10^9, and burst * period_ms <= 4.5 * 10^12), cost (1 .. 10^9;
-- more than the burst in force is denied; with `nocost`, none: p.cost 0).
local function gcra_args(a, nocost)
  local p = {
    rate = int('rate', ARGV[a], 1, RUST.quota.MAX_GCRA_RATE),
    period = int('period', ARGV[a + 1], 1, RUST.quota.MAX_GCRA_PERIOD_MS),
    burst = int('burst', ARGV[a + 2], 1, RUST.quota.MAX_LIMIT),
    cost = nocost and 0 or int('cost', ARGV[a + 3], 1, RUST.quota.MAX_LIMIT),
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
-- lib_fixed.lua's fixed_eval does: allowed, retry, take(), reply(), limit (the burst), most
-- (the largest burst these rate and period allow), count() (units in use, a partly elapsed
-- one included) and add(n).
--   limit = burst; remaining: units a call could take at once now (after this call);
--   reset_ms: until the quota is whole again (the TAT reached);
--   retry_after_ms: until a call of this cost passes.
local function gcra_eval(p, key, ovr, clock)
  local now = clock()
  local rate = p.rate
  local most = math.min(RUST.quota.MAX_LIMIT, math.floor(RUST.quota.MAX_GCRA_SPAN / p.period))
  local burst = override(ovr, p.burst, most)
  local T = p.period * 1000 -- one emission interval, in u
  local W = burst * T       -- the burst window, in u

  -- How far the TAT is ahead of now, in u (0 when it is behind: the quota is whole).
  local st = redis.call('HMGET', key, 't', 'r', 'd')
  local ahead = 0
  -- (Only numbers in redcount's text: anything else is untrusted, as no TAT; prelude: stored.)
  local tat, rem, debt = stored(st[1]), stored(st[2]), stored(st[3])
  if tat and tat >= now then
    ahead = (tat - now) * rate + math.min(math.max(rem or 0, 0), rate - 1)
    -- A server clock that stepped back leaves the TAT further ahead than any burst and the
    -- debt it records: cap it.
    local top = W + math.min(math.max(debt or 0, 0), most - burst) * T
    if ahead > top then ahead = top end
  end

  local after = ahead + p.cost * T
  local q = {allowed = after <= W, retry = 0, limit = burst, most = most}
  if not q.allowed then q.retry = ceil_div(after - W, rate * 1000) end
  function q.count() return ceil_div(ahead, T) end
  function q.add(n)
    ahead = math.max(0, ahead + n * T)
    -- Whole again (units given back): no key says the same, now rather than a ms later.
    if ahead == 0 then
      redis.call('DEL', key)
      st[3] = nil
      return
    end
    redis.call('HSET', key, 't', s(now + floor_div(ahead, rate)), 'r', s(ahead % rate))
    if ahead > W then
      redis.call('HSET', key, 'd', s(ceil_div(ahead - W, T)))
      st[3] = true
    elseif st[3] then
      redis.call('HDEL', key, 'd')
      st[3] = nil
    end
    -- Past the TAT the key says nothing a missing key does not: let it go then.
    redis.call('PEXPIRE', key, s(math.max(1, ceil_div(ahead, rate * 1000))))
  end
  function q.take() q.add(p.cost) end
  function q.reply()
    return {q.allowed and 1 or 0, burst, floor_div(math.max(0, W - ahead), T), ceil_div(ahead, rate * 1000), q.retry}
  end
  return q
end
