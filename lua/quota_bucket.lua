-- redcount: quota, token bucket with integer refills (no floating-point drift).
-- KEYS[1]  hash {tokens, ts}: ts = time of the last refill step, in ms
-- ARGV[1]  capacity (1 .. 10^9); a new bucket starts full
-- ARGV[2]  tokens added per refill step (1 .. capacity)
-- ARGV[3]  refill step in ms (1 .. 10^12)
-- ARGV[4]  cost of this call (1 .. capacity; more than an override allows is denied)
-- ARGV[5]  "1" to peek (consume nothing, write nothing), else "0"
-- Reply: {allowed, limit, remaining, reset_ms, retry_after_ms}
--   reset_ms: until the bucket is full again; retry_after_ms: 0 when allowed, else until
--   enough tokens for this cost have been added.
-- KEYS[2]  the subject's override of the capacity (prelude.lua: override)
-- Optional: KEYS[3] + two last ARGV make it idempotent (prelude.lua).
-- (Runs after prelude.lua: int, s, idempotency.)

local cap = int('capacity', ARGV[1], 1, 1000000000)
local refill = int('refill', ARGV[2], 1, cap)
local step = int('interval', ARGV[3], 1, 1000000000000)
local cost = int('cost', ARGV[4], 1, 1000000000)
local peek = ARGV[5] == '1'

local replay, finish = idempotency(2)
if replay then return replay end
cap = override(KEYS[2], cap, 1000000000)

local now = now_ms()
local st = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens, ts = cap, now
if st[1] and st[2] then
  tokens = math.min(cap, math.max(0, tonumber(st[1]) or 0))
  ts = tonumber(st[2]) or now
  if ts > now then ts = now end -- the server clock stepped back: add nothing
  local steps = math.floor((now - ts) / step)
  if steps > 0 then
    tokens = math.min(cap, tokens + steps * refill)
    ts = ts + steps * step
  end
end
if tokens >= cap then ts = now end -- a full bucket starts its next step on first use

local function until_tokens(n) -- ms until the bucket holds n tokens
  if tokens >= n then return 0 end
  local k = math.ceil((n - tokens) / refill)
  return math.max(0, ts + k * step - now)
end

local allowed = tokens >= cost
local retry = 0
if allowed then
  if not peek then
    tokens = tokens - cost
    local full = until_tokens(cap)
    redis.call('HSET', KEYS[1], 'tokens', s(tokens), 'ts', s(ts))
    redis.call('PEXPIRE', KEYS[1], s(math.max(1, full)))
  end
else
  retry = until_tokens(cost)
end
return finish({allowed and 1 or 0, cap, tokens, until_tokens(cap), retry})
