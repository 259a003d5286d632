-- redcount: quota, sliding window log (exact: no call is counted in two windows or none).
-- KEYS[1]  sorted set: score = time in ms of an admitted call, member = "<sec>.<usec>:<cost>[:n]"
-- ARGV[1]  limit (1 .. 10000: the log holds at most limit entries, so every call is O(limit))
-- ARGV[2]  window in ms (1 .. 10^12)
-- ARGV[3]  cost of this call (1 .. limit)
-- ARGV[4]  "1" to peek (consume nothing, write nothing), else "0"
-- Reply: {allowed, limit, remaining, reset_ms, retry_after_ms}
--   reset_ms: until every logged call has left the window (0 when none is logged);
--   retry_after_ms: 0 when allowed, else until enough units leave the window for this cost.
-- Optional: KEYS[2] + two last ARGV make it idempotent (prelude.lua).
-- (Runs after prelude.lua: int, s, idempotency.)

local replay, finish = idempotency(1)
if replay then return replay end

local key = KEYS[1]
local limit = int('limit', ARGV[1], 1, 10000)
local window = int('window', ARGV[2], 1, 1000000000000)
local cost = int('cost', ARGV[3], 1, limit)
local peek = ARGV[4] == '1'

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local floor = now - window -- an entry at time x counts while x > now - window
-- Read only the live part (bounded by LIMIT), so a peek needs no write.
local live = redis.call('ZRANGEBYSCORE', key, '(' .. s(floor), '+inf', 'WITHSCORES', 'LIMIT', 0, limit + 1)
local used = 0
for i = 1, #live, 2 do
  used = used + (tonumber(string.match(live[i], ':(%d+)')) or 1)
end
local allowed = used + cost <= limit
local newest = nil
if #live > 0 then newest = tonumber(live[#live]) end
if allowed and not peek then
  redis.call('ZREMRANGEBYSCORE', key, '-inf', s(floor))
  local m = t[1] .. '.' .. t[2] .. ':' .. cost
  local n = 0
  while redis.call('ZSCORE', key, m) do -- same microsecond twice: keep members distinct
    n = n + 1
    m = t[1] .. '.' .. t[2] .. ':' .. cost .. ':' .. n
  end
  redis.call('ZADD', key, s(now), m)
  redis.call('PEXPIRE', key, s(window))
  used = used + cost
  newest = now
end
local reset = 0
if newest then reset = newest + window - now end
local retry = 0
if not allowed then
  -- Walk from the oldest entry until enough units would have left the window.
  local need = used + cost - limit
  local freed = 0
  retry = reset
  for i = 1, #live, 2 do
    freed = freed + (tonumber(string.match(live[i], ':(%d+)')) or 1)
    if freed >= need then
      retry = tonumber(live[i + 1]) + window - now
      break
    end
  end
end
return finish({allowed and 1 or 0, limit, math.max(0, limit - used), reset, retry})
