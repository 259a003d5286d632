-- redcount: quota, sliding window log (exact: no call is counted in two windows or none).
-- KEYS[1]  sorted set: score = time in ms of an admitted call, member = "<sec>.<usec>:<cost>[:n]"
-- ARGV[1]  limit (1 .. 10000: the log holds at most limit entries, so every call is O(limit))
-- ARGV[2]  window in ms (1 .. 10^12)
-- ARGV[3]  cost of this call (1 .. limit)
-- ARGV[4]  "1" to peek (consume nothing, write nothing), else "0"
-- Reply: {allowed, limit, remaining, reset_ms, retry_after_ms}
--   reset_ms: until every logged call has left the window (0 when none is logged);
--   retry_after_ms: 0 when allowed, else until enough units leave the window for this cost.
local function int(name, v, lo, hi)
  if type(v) ~= 'string' or not string.match(v, '^%-?%d+$') then
    return error({err = 'ERR redcount: ' .. name .. ' must be a decimal integer'})
  end
  local n = tonumber(v)
  if n == nil or n ~= n or n < lo or n > hi then
    return error({err = 'ERR redcount: ' .. name .. ' out of range'})
  end
  return n
end
local function s(n) return string.format('%.0f', n) end

-- Idempotency (optional): with one key more than the script needs, KEYS[2] holds this
-- call's reply for ARGV[#ARGV-1] ms, tagged with the request's fingerprint ARGV[#ARGV]; a
-- replay returns the stored reply unchanged, the same key with another request is refused.
local IDEM, idem_ttl, idem_fp = KEYS[2], nil, nil
if IDEM then
  idem_ttl = int('idempotency_ttl', ARGV[#ARGV - 1], 1, 604800000)
  idem_fp = ARGV[#ARGV]
  local prev = redis.call('GET', IDEM)
  if prev then
    local fp, body = string.match(prev, '^([^|]*)|(.*)$')
    if fp ~= idem_fp then
      return error({err = 'ERR redcount: idempotency key reused for a different request'})
    end
    local out = {}
    for n in string.gmatch(body, '-?%d+') do out[#out + 1] = tonumber(n) end
    return out
  end
end
local function finish(reply)
  if IDEM then
    local parts = {}
    for i = 1, #reply do parts[i] = string.format('%.0f', reply[i]) end
    redis.call('SET', IDEM, idem_fp .. '|' .. table.concat(parts, ','), 'PX', string.format('%.0f', idem_ttl))
  end
  return reply
end

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
