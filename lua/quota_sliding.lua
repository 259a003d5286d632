-- redcount: quota, sliding window log (exact: no call is counted in two windows or none).
-- KEYS[1]  sorted set: score = time in ms of an admitted call, member = "c<total>:<cost>",
--          <total> (16 digits, zero-padded) being the running sum of costs up to and
--          including this call. Sums of any run of calls are then two reads, so every call
--          costs O(log n), not O(limit) (issue 9: 9-15 ms of Redis time per call at 10,000).
--          Members of the earlier layout "<sec>.<usec>:<cost>[:n]" are still read (by a scan,
--          while any is in the window).
-- ARGV[1]  limit (1 .. 10000)
-- ARGV[2]  window in ms (1 .. 10^12)
-- ARGV[3]  cost of this call (1 .. limit; more than an override allows is denied)
-- ARGV[4]  "1" to peek (consume nothing, write nothing), else "0"
-- Reply: {allowed, limit, remaining, reset_ms, retry_after_ms}
--   reset_ms: until every logged call has left the window (0 when none is logged);
--   retry_after_ms: 0 when allowed, else until enough units leave the window for this cost.
-- KEYS[2]  the subject's override of the limit (prelude.lua: override)
-- Optional: KEYS[3] + two last ARGV make it idempotent (prelude.lua).
-- (Runs after prelude.lua: int, s, idempotency.)

local key = KEYS[1]
local limit = int('limit', ARGV[1], 1, 10000)
local window = int('window', ARGV[2], 1, 1000000000000)
local cost = int('cost', ARGV[3], 1, 10000)
local peek = ARGV[4] == '1'

local replay, finish = idempotency(2)
if replay then return replay end
limit = override(KEYS[2], limit, 10000)

local now = now_ms()
local floor = now - window -- an entry at time x counts while x > now - window

-- The running total and cost of an entry; no total for the earlier layout.
local function entry(member)
  local total, c = string.match(member, '^c(%d+):(%d+)$')
  if total then return tonumber(total), tonumber(c) end
  return nil, tonumber(string.match(member, ':(%d+)')) or 1
end

-- Scores never decrease with rank (see `at` below), so the expired entries are the first
-- `expired` ranks and the live ones the rest.
local expired = redis.call('ZCOUNT', key, '-inf', s(floor))
local size = redis.call('ZCARD', key)
local used, newest, last_total, base = 0, nil, 0, nil
local legacy = nil -- the live entries, read by a scan, when some have no running total
if size > 0 then
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  last_total = entry(last[1])
  if size > expired then
    newest = tonumber(last[2])
    local first = redis.call('ZRANGE', key, expired, expired)
    local first_total, first_cost = entry(first[1])
    if first_total and last_total then
      base = first_total - first_cost
      used = last_total - base
    else
      legacy = redis.call('ZRANGEBYSCORE', key, '(' .. s(floor), '+inf', 'WITHSCORES', 'LIMIT', 0, limit + 1)
      for i = 1, #legacy, 2 do used = used + select(2, entry(legacy[i])) end
    end
  end
  last_total = last_total or used
end
local allowed = used + cost <= limit
if allowed and not peek then
  -- Drop expired entries, a bounded number per call (each call adds one): no call pays for
  -- a long backlog at once.
  if expired > 0 then redis.call('ZREMRANGEBYRANK', key, 0, math.min(expired, 64) - 1) end
  -- Never before the newest entry, so a clock stepping back keeps scores in rank order.
  local at = now
  if newest and newest > at then at = newest end
  redis.call('ZADD', key, s(at), 'c' .. string.format('%016.0f', last_total + cost) .. ':' .. cost)
  redis.call('PEXPIRE', key, s(at - now + window))
  used = used + cost
  newest = at
end
local reset = 0
if newest then reset = newest + window - now end
local retry = 0
if not allowed then
  -- The oldest live entry by which enough units would have left the window.
  local need = used + cost - limit
  retry = reset
  if cost > limit then
    -- Above a lowered override: it cannot pass; say when the quota is whole.
    retry = math.max(1, reset)
  elseif legacy then
    local freed = 0
    for i = 1, #legacy, 2 do
      freed = freed + select(2, entry(legacy[i]))
      if freed >= need then
        retry = tonumber(legacy[i + 1]) + window - now
        break
      end
    end
  elseif base then
    local lo, hi = expired, size - 1 -- the last entry frees `used` >= need
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      if entry(redis.call('ZRANGE', key, mid, mid)[1]) - base >= need then hi = mid else lo = mid + 1 end
    end
    retry = tonumber(redis.call('ZRANGE', key, lo, lo, 'WITHSCORES')[2]) + window - now
  end
end
return finish({allowed and 1 or 0, limit, math.max(0, limit - used), reset, retry})
