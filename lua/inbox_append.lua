-- redcount: append a message to a per-user inbox (a week-long message cache).
-- KEYS[1]  sorted set: score = message id, member = 4-byte little-endian Unix time (s)
--          .. 8-byte little-endian id .. body (the id makes equal bodies distinct members)
-- ARGV[1]  message id (0 .. 2^53-1, decimal)
-- ARGV[2]  body (any bytes)
-- ARGV[3]  ttl in ms (1 .. inbox::MAX_TTL_MS, 1,000 days): the inbox lives at least this
--          long after every append, so the expiry follows the newest message
-- ARGV[4]  max length kept: older messages beyond it are dropped, at most 1,000 per call
--          (1 .. 10^6), so lowering it costs bounded Redis time per call
-- Reply: {stored, length}; stored 0 = a message with this id exists already (a retried
-- append is not stored twice).
-- Optional: KEYS[2] + two last ARGV make it idempotent (prelude.lua).
-- (Runs after prelude.lua: int, s, idempotency.)

local key = KEYS[1]
local id = int('id', ARGV[1], 0, RUST.validate.MAX_SAFE)
local body = ARGV[2]
local ttl = int('ttl', ARGV[3], 1, RUST.inbox.MAX_TTL_MS)
local max_len = int('max_len', ARGV[4], 1, RUST.inbox.MAX_LEN)

local replay, finish = idempotency(1, 4)
if replay then return replay end

-- An id already stored changes nothing and stores nothing (prelude: idempotency).
if #redis.call('ZRANGEBYSCORE', key, ARGV[1], ARGV[1], 'LIMIT', 0, 1) > 0 then
  return {0, redis.call('ZCARD', key)}
end
local function le(n, bytes) -- n as `bytes` little-endian bytes (exact below 2^53)
  local out = {}
  for i = 1, bytes do
    out[i] = string.char(n % 256)
    n = math.floor(n / 256)
  end
  return table.concat(out)
end
local now = now_s()
redis.call('ZADD', key, ARGV[1], le(now, 4) .. le(id, 8) .. body)
local left = redis.call('PTTL', key)
if left < ttl then redis.call('PEXPIRE', key, s(ttl)) end
local len = redis.call('ZCARD', key)
if len > max_len then
  local drop = math.min(len - max_len, 1000)
  redis.call('ZREMRANGEBYRANK', key, 0, drop - 1)
  len = len - drop
end
return finish({1, len})
