-- redcount: quota, fixed window (N per window, windows aligned to the Unix epoch).
-- KEYS[1]  hash {w = window number, n = units used in it}
-- ARGV[1]  limit (1 .. 10^9)
-- ARGV[2]  window in ms (1 .. 10^12)
-- ARGV[3]  cost of this call (1 .. limit; more than an override allows is denied)
-- ARGV[4]  "1" to peek (report what this call would get, consume nothing, write nothing), else "0"
-- Reply: {allowed, limit, remaining, reset_ms, retry_after_ms}
--   reset_ms: until the window ends and remaining is back to limit;
--   retry_after_ms: 0 when allowed, else until a call of this cost can pass.
-- KEYS[2]  the subject's override of the limit (prelude.lua: override)
-- Optional: KEYS[3] + two last ARGV make it idempotent (prelude.lua).
-- (Runs after prelude.lua: int, s, idempotency.)

local limit = int('limit', ARGV[1], 1, 1000000000)
local window = int('window', ARGV[2], 1, 1000000000000)
local cost = int('cost', ARGV[3], 1, 1000000000)
local peek = ARGV[4] == '1'

local replay, finish = idempotency(2)
if replay then return replay end
limit = override(KEYS[2], limit, 1000000000)

local now = now_ms()
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
