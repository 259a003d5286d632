-- redcount: the sliding-window-log quota (exact: no call is counted in two windows or none)
-- as functions, shared by quota_sliding.lua, decide.lua, quota_refund.lua and the
-- reservation scripts.
-- State: KEYS sorted set, score = time in ms of an admitted call, member =
-- "c<total>:<cost>[:<tag>]", <total> (16 digits, zero-padded) being the running sum of costs
-- up to and including this call, <tag> a reservation's id on the entry it reserved. Sums of
-- any run of calls are then two reads, so every call costs O(log n), not O(limit). Members of
-- the earlier layout "<sec>.<usec>:<cost>[:n]" are still read (by a scan, while any is in the
-- window).
-- Units given back come off logged entries, so what stays logged keeps its time: a
-- reservation's unused units come off its own entry (lib_give.lua, by its tag), an admin
-- refund's off the newest entries. Units charged late are a new entry at the time they are
-- charged.

-- The parameters at ARGV[a .. a+2]: limit (1 .. 10000), window in ms (1 .. 10^12), cost
-- (1 .. 10000; more than the limit in force is denied); with `nocost`, no cost (p.cost 0).
local function sliding_args(a, nocost)
  return {
    limit = int('limit', ARGV[a], 1, RUST.quota.MAX_SLIDING_LIMIT),
    window = int('window', ARGV[a + 1], 1, RUST.quota.MAX_WINDOW_MS),
    cost = nocost and 0 or int('cost', ARGV[a + 2], 1, RUST.quota.MAX_SLIDING_LIMIT),
  }
end

-- The running total and cost of an entry; no total for the earlier layout.
local function sliding_entry(member)
  local total, c = string.match(member, '^c(%d+):(%d+)')
  if total then return tonumber(total), tonumber(c) end
  return nil, tonumber(string.match(member, ':(%d+)')) or 1
end

-- An entry's member: its running total, its cost, and what follows them (a tag, or '').
local function sliding_member(total, cost, rest)
  return 'c' .. string.format('%016.0f', total) .. ':' .. s(cost) .. rest
end

-- Reads the log at server time (`clock()`, in µs) and decides; writes nothing. Returns a table as
-- lib_fixed.lua's fixed_eval does: allowed, retry, take(), reply(), limit, most (10,000),
-- count(), and add(n, tag) (an entry of n units, n > 0, tagged when `tag` is given; returns
-- its time).
--   reset_ms: until every logged call has left the window (0 when none is logged);
--   retry_after_ms: until enough units leave the window for this cost.
local function sliding_eval(p, key, ovr, clock)
  local limit = override(ovr, p.limit, RUST.quota.MAX_SLIDING_LIMIT)
  local window, cost = p.window, p.cost
  local now = math.floor(clock() / 1000)
  local floor = now - window -- an entry at time x counts while x > now - window
  -- Scores never decrease with rank (see take below), so the expired entries are the first
  -- `expired` ranks and the live ones the rest.
  local expired = redis.call('ZCOUNT', key, '-inf', s(floor))
  local size = redis.call('ZCARD', key)
  local used, newest, last_total, base = 0, nil, 0, nil
  local legacy = nil -- the live entries, read by a scan, when some have no running total
  if size > 0 then
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    last_total = sliding_entry(last[1])
    -- The newest entry's time in redcount's text, else the log is refused before anything is
    -- written (take() builds its score and the key's expiry on it; inf or 1e300 would fail
    -- PEXPIRE after ZADD).
    if not stored(last[2]) then
      return tampered('the quota')
    end
    if size > expired then
      newest = tonumber(last[2])
      local first = redis.call('ZRANGE', key, expired, expired)
      local first_total, first_cost = sliding_entry(first[1])
      if first_total and last_total then
        base = first_total - first_cost
        used = last_total - base
      else
        legacy = redis.call('ZRANGEBYSCORE', key, '(' .. s(floor), '+inf', 'WITHSCORES', 'LIMIT', 0, limit + 1)
        for i = 1, #legacy, 2 do used = used + select(2, sliding_entry(legacy[i])) end
      end
    end
    last_total = last_total or used
  end
  local q = {allowed = used + cost <= limit, retry = 0, limit = limit, most = RUST.quota.MAX_SLIDING_LIMIT}
  if not q.allowed then
    -- The oldest live entry by which enough units would have left the window.
    local need = used + cost - limit
    local reset = 0
    if newest then reset = newest + window - now end
    q.retry = reset
    if cost > limit then
      -- Above a lowered override: it cannot pass; say when the quota is whole.
      q.retry = math.max(1, reset)
    elseif legacy then
      local freed = 0
      for i = 1, #legacy, 2 do
        freed = freed + select(2, sliding_entry(legacy[i]))
        if freed >= need then
          q.retry = tonumber(legacy[i + 1]) + window - now
          break
        end
      end
    elseif base then
      local lo, hi = expired, size - 1 -- the last entry frees `used` >= need
      while lo < hi do
        local mid = math.floor((lo + hi) / 2)
        if sliding_entry(redis.call('ZRANGE', key, mid, mid)[1]) - base >= need then hi = mid else lo = mid + 1 end
      end
      q.retry = tonumber(redis.call('ZRANGE', key, lo, lo, 'WITHSCORES')[2]) + window - now
    end
  end
  function q.count() return used end
  function q.add(n, tag)
    -- Drop expired entries, a bounded number per call (each call adds one): no call pays
    -- for a long backlog at once.
    if expired > 0 then
      redis.call('ZREMRANGEBYRANK', key, 0, math.min(expired, 64) - 1)
      expired = 0
    end
    -- Never before the newest entry, so a clock stepping back keeps scores in rank order.
    local at = now
    if newest and newest > at then at = newest end
    last_total = last_total + n
    redis.call('ZADD', key, s(at), sliding_member(last_total, n, tag and (':' .. tag) or ''))
    redis.call('PEXPIRE', key, s(at - now + window))
    used = used + n
    newest = at
    return at
  end
  function q.take() q.add(cost) end
  function q.reply()
    local reset = 0
    if newest then reset = newest + window - now end
    return {q.allowed and 1 or 0, limit, math.max(0, limit - used), reset, q.retry}
  end
  return q
end
