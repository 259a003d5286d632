-- redcount: once-per-window claim ("one prize per user per 24 h").
-- KEYS[1]  the claim key of one subject
-- ARGV[1]  window in ms (1 .. 10^12)
-- Reply: {claimed, ms_left}; claimed 1 = this call took the claim, 0 = already taken.
-- ms_left is the time until the window ends (-1 if the key was given no expiry by someone else).
-- The stored value is the server time of the claim, in ms.
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
local w = ARGV[1]
local window = int('window', w, 1, 1000000000000)

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

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ok = redis.call('SET', KEYS[1], string.format('%.0f', now), 'NX', 'PX', w)
if ok then return finish({1, window}) end
return finish({0, redis.call('PTTL', KEYS[1])})
