-- redcount: append a message to a per-user inbox (a week-long message cache).
-- KEYS[1]  sorted set: score = message id, member = 4-byte little-endian Unix time (s) .. body
-- ARGV[1]  message id (0 .. 2^53-1, decimal)
-- ARGV[2]  body (any bytes)
-- ARGV[3]  ttl in ms, set when this message creates the inbox (1 .. 10^11)
-- ARGV[4]  max length kept: older messages beyond it are dropped now (1 .. 10^6)
-- Reply: {stored, length}; stored 0 = a message with this id exists already (a retried
-- append is not stored twice).
-- Optional: KEYS[2] + two last ARGV make it idempotent (prelude.lua).
-- (Runs after prelude.lua: int, s, idempotency.)

local replay, finish = idempotency(1)
if replay then return replay end

local key = KEYS[1]
local id = int('id', ARGV[1], 0, 9007199254740991)
local body = ARGV[2]
local ttl = int('ttl', ARGV[3], 1, 100000000000)
local max_len = int('max_len', ARGV[4], 1, 1000000)

if #redis.call('ZRANGEBYSCORE', key, ARGV[1], ARGV[1], 'LIMIT', 0, 1) > 0 then
  return finish({0, redis.call('ZCARD', key)})
end
local now = tonumber(redis.call('TIME')[1])
local stamp = string.char(now % 256, math.floor(now / 256) % 256,
  math.floor(now / 65536) % 256, math.floor(now / 16777216) % 256)
local existed = redis.call('EXISTS', key)
redis.call('ZADD', key, ARGV[1], stamp .. body)
if existed == 0 then redis.call('PEXPIRE', key, s(ttl)) end
local len = redis.call('ZCARD', key)
if len > max_len then
  redis.call('ZREMRANGEBYRANK', key, 0, len - max_len - 1)
  len = max_len
end
return finish({1, len})
