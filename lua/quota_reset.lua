-- redcount: forget one subject's usage of a quota (an admin action): one DEL, no SCAN.
-- KEYS[1]  the quota's state key
-- Reply: {existed}; 1 when there was usage to forget.
-- (A script rather than a plain DEL so that an Idempotency-Key replay answers the same.)
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
return finish({redis.call('DEL', KEYS[1])})
