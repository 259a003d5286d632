-- redcount: trim an inbox by age and length.
-- KEYS[1]  the inbox sorted set (see inbox_append.lua)
-- ARGV[1]  max age in s (1 .. 10^9): messages stamped earlier than now - max age are expired
-- ARGV[2]  max length kept (1 .. 10^6)
-- ARGV[3]  how many of the oldest messages to examine for expiry (1 .. 10^5): bounds the work
-- Reply: {deleted, newest_time}; newest_time = stamp of the newest remaining message, 0 when
-- the inbox is now empty (and deleted).
-- Expired messages are dropped from the oldest and the scan stops at the first live one,
-- then the length is capped, then an empty inbox is deleted.
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

local key = KEYS[1]
local max_age = int('max_age', ARGV[1], 1, 1000000000)
local max_len = int('max_len', ARGV[2], 1, 1000000)
local scan = int('scan', ARGV[3], 1, 100000)

local function stamp(m) -- nil for a member too short to carry a stamp
  if #m < 4 then return nil end
  local a, b, c, d = string.byte(m, 1, 4)
  return a + b * 256 + c * 65536 + d * 16777216
end

local now = tonumber(redis.call('TIME')[1])
local cutoff = now - max_age
local deleted = 0
local oldest = redis.call('ZRANGE', key, 0, scan - 1)
local n = 0
for i = 1, #oldest do
  local ts = stamp(oldest[i])
  if ts ~= nil and ts >= cutoff then break end
  n = i -- expired, or malformed (unreadable stamp): drop it
end
if n > 0 then
  redis.call('ZREMRANGEBYRANK', key, 0, n - 1)
  deleted = n
end
local len = redis.call('ZCARD', key)
if len > max_len then
  redis.call('ZREMRANGEBYRANK', key, 0, len - max_len - 1)
  deleted = deleted + len - max_len
  len = max_len
end
if len == 0 then
  redis.call('DEL', key)
  return finish({deleted, 0})
end
local newest = redis.call('ZRANGE', key, -1, -1)
return finish({deleted, stamp(newest[1]) or 0})
