-- redcount: quota, fixed window (N per window, windows aligned to the Unix epoch).
-- KEYS[1]  hash {w = window number, n = units used in it}
-- ARGV[1]  limit (1 .. 10^9)
-- ARGV[2]  window in ms (1 .. 10^12)
-- ARGV[3]  cost of this call (1 .. limit)
-- ARGV[4]  "1" to peek (report what this call would get, consume nothing, write nothing), else "0"
-- Reply: {allowed, limit, remaining, reset_ms, retry_after_ms}
--   reset_ms: until the window ends and remaining is back to limit;
--   retry_after_ms: 0 when allowed, else until a call of this cost can pass.
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

local limit = int('limit', ARGV[1], 1, 1000000000)
local window = int('window', ARGV[2], 1, 1000000000000)
local cost = int('cost', ARGV[3], 1, limit)
local peek = ARGV[4] == '1'

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local w = math.floor(now / window)
local st = redis.call('HMGET', KEYS[1], 'w', 'n')
local used = 0
if tonumber(st[1]) == w then used = tonumber(st[2]) or 0 end
local reset = (w + 1) * window - now
local allowed = used + cost <= limit
if allowed and not peek then
  used = used + cost
  redis.call('HSET', KEYS[1], 'w', s(w), 'n', s(used))
  redis.call('PEXPIRE', KEYS[1], s(reset))
end
local retry = 0
if not allowed then retry = reset end
return finish({allowed and 1 or 0, limit, math.max(0, limit - used), reset, retry})
