-- redcount: give units back to a subject's quota (the work they paid for did not happen),
-- never above the limit, each algorithm in its own terms. An admin action: a public refund
-- would undo the limit.
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
-- (Runs after prelude.lua and lib_sliding.lua: sliding_entry.)

local key, algo = KEYS[1], ARGV[1]
local units = int('cost', ARGV[2], 1, RUST.quota.MAX_LIMIT)
local p1, p2, p3
if algo == 'fw' or algo == 'sw' then
  p1 = int('limit', ARGV[3], 1, RUST.quota.MAX_LIMIT)
  p2 = int('window', ARGV[4], 1, RUST.quota.MAX_WINDOW_MS)
elseif algo == 'tb' then
  p1 = int('capacity', ARGV[3], 1, RUST.quota.MAX_LIMIT)
  p2 = int('refill', ARGV[4], 1, p1)
  p3 = int('interval', ARGV[5], 1, RUST.quota.MAX_WINDOW_MS)
  if math.ceil(p1 / p2) * p3 > RUST.quota.MAX_BUCKET_SPAN then
    return error({err = 'ERR redcount: interval out of range'})
  end
elseif algo == 'gc' then
  p1 = int('rate', ARGV[3], 1, RUST.quota.MAX_GCRA_RATE)
  p2 = int('period', ARGV[4], 1, RUST.quota.MAX_GCRA_PERIOD_MS)
  p3 = int('burst', ARGV[5], 1, RUST.quota.MAX_LIMIT)
else
  return error({err = 'ERR redcount: algorithm must be fw, sw, tb or gc'})
end

local replay, finish = idempotency(3, (algo == 'fw' or algo == 'sw') and 4 or 5)
if replay then return replay end
-- The subject's override of the size, as the take script reads it.
if algo == 'tb' then
  p1 = override(KEYS[2], p1, math.min(RUST.quota.MAX_LIMIT, math.floor(RUST.quota.MAX_BUCKET_SPAN / p3) * p2))
elseif algo == 'gc' then
  p3 = override(KEYS[2], p3, math.min(RUST.quota.MAX_LIMIT, math.floor(RUST.quota.MAX_GCRA_SPAN / p2)))
end

local given = 0
if algo == 'fw' then
  -- Only units of the current window: the state's key ends with its window (lib_fixed.lua),
  -- so an earlier window's units are already back.
  local v = redis.call('GET', key)
  local used = stored(v) -- (as the take reads it: other text gives nothing back)
  if used then
    -- Only a count the take would count (lib_fixed.lua): whole, with an expiry within a window.
    local ttl = redis.call('PTTL', key)
    if used < 0 or used % 1 ~= 0 or ttl < 0 or ttl > p2 then used = 0 end
    for _, h in ipairs(redis.call('HVALS', KEYS[3])) do used = used - math.max(0, stored(h) or 0) end
    given = math.max(0, math.min(units, used))
    if given > 0 then redis.call('DECRBY', key, s(given)) end -- the key keeps its expiry
  else -- the layout before, "<window>:<used>"
    local sw, sn = string.match(v or '', '^(%d+):(%d+)$')
    if tonumber(sw) == math.floor(now_ms() / p2) then
      used = tonumber(sn)
      given = math.min(units, used)
      if given > 0 then redis.call('SET', key, sw .. ':' .. s(used - given), 'KEEPTTL') end
    end
  end
elseif algo == 'sw' then
  -- The newest logged calls give their units back first; a call partly refunded keeps the
  -- rest of its cost. The running totals (lib_sliding.lua) find the first entry to change by
  -- a binary search (O(log n)): the entries after it go in one ZREMRANGEBYRANK, it keeps
  -- what was not given back, and the totals of the older entries stay true. A log that
  -- still holds the earlier layout gives nothing back.
  local floor = now_ms() - p2
  local expired = redis.call('ZCOUNT', key, '-inf', s(floor))
  local size = redis.call('ZCARD', key)
  local last_total = size > expired and sliding_entry(redis.call('ZRANGE', key, -1, -1)[1])
  local first_total, first_cost = nil, nil
  if last_total then first_total, first_cost = sliding_entry(redis.call('ZRANGE', key, expired, expired)[1]) end
  -- At most the newest 500 logged calls change in one refund (removing entries costs
  -- Redis time per entry): their units, or fewer; the reply says how many came back.
  local oldest = math.max(expired, size - 500)
  if first_total and oldest > expired then
    first_total, first_cost = sliding_entry(redis.call('ZRANGE', key, oldest, oldest)[1])
  end
  if first_total then
    given = math.min(units, last_total - (first_total - first_cost))
    local target = last_total - given -- the running total after the refund
    -- The first live entry whose total passes the target (the last one does: given > 0).
    local lo, hi, legacy = oldest, size - 1, false
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      local total = sliding_entry(redis.call('ZRANGE', key, mid, mid)[1])
      if not total then legacy = true break end
      if total > target then hi = mid else lo = mid + 1 end
    end
    if legacy then
      given = 0
    elseif given > 0 then
      local at = redis.call('ZRANGE', key, lo, lo, 'WITHSCORES')
      local total, c = sliding_entry(at[1])
      local keep = c - (total - target)
      redis.call('ZREMRANGEBYRANK', key, lo, -1)
      if keep > 0 then
        redis.call('ZADD', key, at[2], 'c' .. string.format('%016.0f', target) .. ':' .. keep)
      end
    end
  end
elseif algo == 'tb' then
  local cap, refill, step = p1, p2, p3
  local st = redis.call('HMGET', key, 'tokens', 'ts')
  if st[1] and st[2] then
    -- The refills due first (as the take script counts them), so a refund fills only
    -- what is really missing.
    local now = now_ms()
    local tokens = math.min(cap, math.max(0, stored(st[1]) or 0))
    local ts = math.min(stored(st[2]) or now, now)
    local steps = math.floor((now - ts) / step)
    if steps > 0 then
      tokens = math.min(cap, tokens + steps * refill)
      ts = ts + steps * step
    end
    given = math.max(0, math.min(units, cap - tokens))
    if given > 0 then redis.call('HSET', key, 'tokens', s(tokens + given), 'ts', s(ts)) end
  end
else
  local rate, T = p1, p2 * 1000
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  local st = redis.call('HMGET', key, 't', 'r')
  local tat, rem = stored(st[1]), stored(st[2]) or 0
  if tat and tat >= now then
    local ahead = math.min((tat - now) * rate + math.min(math.max(rem, 0), rate - 1), p3 * T)
    -- Whole units in use (a partly elapsed one stays in use).
    local used = (ahead - ahead % T) / T
    if ahead % T > 0 then used = used + 1 end
    given = math.min(units, used)
    ahead = math.max(0, ahead - given * T)
    if given > 0 then redis.call('HSET', key, 't', s(now + (ahead - ahead % rate) / rate), 'r', s(ahead % rate)) end
  end
end
-- Nothing given back changes nothing and stores nothing (prelude: idempotency).
return finish({given}, given > 0)
