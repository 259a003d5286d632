-- redcount: the token-bucket quota with integer refills (no floating-point drift) as
-- functions, shared by quota_bucket.lua, decide.lua, quota_refund.lua and the reservation
-- scripts.
-- State: KEYS hash {tokens, ts}: ts = time of the last refill step, in ms. A new bucket
-- starts full. Tokens go below 0 only by a reservation's overrun charged as debt (at most
-- the policy's max_debt), which the refill repays; units given back go back in as tokens,
-- never above the capacity.

-- The parameters at ARGV[a .. a+3]: capacity (1 .. 10^9), tokens added per refill step
-- (1 .. capacity), refill step in ms (1 .. 10^12), cost (1 .. 10^9; more than the capacity
-- in force is denied; with `nocost`, none: p.cost 0); and a refill from empty, ceil(capacity
-- / refill) * step, of at most 4.5 * 10^15 ms (the core's MAX_BUCKET_SPAN: the key's expiry
-- and the reset are built on it).
local function bucket_args(a, nocost)
  local cap = int('capacity', ARGV[a], 1, RUST.quota.MAX_LIMIT)
  local p = {
    cap = cap,
    refill = int('refill', ARGV[a + 1], 1, cap),
    step = int('interval', ARGV[a + 2], 1, RUST.quota.MAX_WINDOW_MS),
    cost = nocost and 0 or int('cost', ARGV[a + 3], 1, RUST.quota.MAX_LIMIT),
  }
  if math.ceil(cap / p.refill) * p.step > RUST.quota.MAX_BUCKET_SPAN then
    return error({err = 'ERR redcount: interval out of range'})
  end
  return p
end

-- The largest capacity an override may give with this refill and step (the same bound).
local function bucket_max_cap(refill, step)
  return math.min(RUST.quota.MAX_LIMIT, math.floor(RUST.quota.MAX_BUCKET_SPAN / step) * refill)
end

-- Reads the bucket at server time (`clock()`, in µs) and decides; writes nothing. Returns a table as
-- lib_fixed.lua's fixed_eval does: allowed, retry, take(), reply(), limit (the capacity),
-- most, count() (tokens missing: capacity - tokens) and add(n).
--   reset_ms: until the bucket is full again; retry_after_ms: until enough tokens for this
--   cost have been added.
local function bucket_eval(p, key, ovr, clock)
  local most = bucket_max_cap(p.refill, p.step)
  local cap = override(ovr, p.cap, most)
  local refill, step, cost = p.refill, p.step, p.cost
  local now = math.floor(clock() / 1000)
  local st = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens, ts = cap, now
  if st[1] and st[2] then
    -- Never further below 0 than a refill from empty can span (the key's expiry is built
    -- on it): capacity - most.
    tokens = math.min(cap, math.max(cap - most, stored(st[1]) or 0))
    ts = stored(st[2]) or now
    if ts > now then ts = now end -- the server clock stepped back: add nothing
    local steps = math.floor((now - ts) / step)
    if steps > 0 then
      tokens = math.min(cap, tokens + steps * refill)
      ts = ts + steps * step
    end
  end
  if tokens >= cap then ts = now end -- a full bucket starts its next step on first use

  local function until_tokens(n) -- ms until the bucket holds n tokens
    if tokens >= n then return 0 end
    local k = math.ceil((n - tokens) / refill)
    return math.max(0, ts + k * step - now)
  end

  local q = {allowed = tokens >= cost, retry = 0, limit = cap, most = most}
  if not q.allowed then q.retry = until_tokens(cost) end
  function q.count() return cap - tokens end
  function q.add(n)
    tokens = tokens - n
    -- Full again (units given back): no key says the same, now rather than a ms later (a
    -- key left to expire by itself would change Redis after the call).
    if tokens >= cap then
      ts = now
      redis.call('DEL', key)
      return
    end
    redis.call('HSET', key, 'tokens', s(tokens), 'ts', s(ts))
    redis.call('PEXPIRE', key, s(math.max(1, until_tokens(cap))))
  end
  function q.take() q.add(cost) end
  function q.reply() return {q.allowed and 1 or 0, cap, math.max(0, tokens), until_tokens(cap), q.retry} end
  return q
end
