-- redcount: counting semaphore with one lease per holder ("at most 60 devices, 300 s lease").
-- KEYS[1]  sorted set: member = holder id, score = lease end in ms (server time)
-- KEYS[2]  hash: holder id -> its fencing token; '#' -> the last token issued
-- KEYS[3]  this semaphore's override of the limit (quota_override.lua sets it)
-- ARGV[1]  op: "acquire", "renew", "release" or "check"
-- ARGV[2]  holder id
-- ARGV[3]  limit (1 .. 10^6)
-- ARGV[4]  lease in ms (1 .. 10^10)
-- ARGV[5]  the fencing token to check (check only; "0" otherwise)
-- Reply: {code, in_use, limit, earliest_ms, lease_ms, fencing_token}
--   code: 1 acquired, 2 renewed (the holder already held a lease: acquire is idempotent),
--         0 full, 3 released, 4 not a holder (release/renew of an unknown or expired holder),
--         5 held (check: this token's lease is live), 6 ended (check: the token was issued,
--         its lease is over), 7 never held (check: no such token was issued)
--   earliest_ms: until the earliest lease ends (-1 when nobody holds one)
--   lease_ms: until this holder's lease ends (0 when it holds none)
--   fencing_token: the lease's token (0 when none): minted with each new lease in this
--         script, kept by renewals, strictly increasing per semaphore. It is at least the
--         server time in µs, so it keeps increasing even after the semaphore's keys expired.
-- Expired leases are reclaimed on every call, so a crashed holder frees its slot when its
-- own lease ends, and one slow holder can never reset the others.
-- Optional: KEYS[4] + two last ARGV make it idempotent (prelude.lua). A replayed acquire or
-- renew tells the current truth: the lease left now, or 4 (not a holder) once it has ended;
-- a replay never grants a slot that is not held.
-- (Runs after prelude.lua: int, s, idempotency.)

local key, tokens, op, holder = KEYS[1], KEYS[2], ARGV[1], id('holder', ARGV[2])
if op ~= 'acquire' and op ~= 'renew' and op ~= 'release' and op ~= 'check' then
  return error({err = 'ERR redcount: op must be acquire, renew, release or check'})
end
local limit = int('limit', ARGV[3], 1, 1000000)
local lease = int('lease', ARGV[4], 1, 10000000000)
local asked = int('fencing_token', ARGV[5] or '0', 0, 9007199254740991)

local replay, finish = idempotency(3)
-- The semaphore's own limit, when an admin set one (prelude.lua: override).
limit = override(KEYS[3], limit, 1000000)

local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
-- Expired leases are reclaimed, with their tokens (in batches: unpack has a limit).
local gone = redis.call('ZRANGEBYSCORE', key, '-inf', s(now))
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', key, '-inf', s(now))
  for i = 1, #gone, 1000 do
    redis.call('HDEL', tokens, unpack(gone, i, math.min(i + 999, #gone)))
  end
end
local held = redis.call('ZSCORE', key, holder)
local function token_of(h) return tonumber(redis.call('HGET', tokens, h)) or 0 end

local function earliest_end()
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if #first == 0 then return -1 end
  return tonumber(first[2]) - now
end

if replay then
  if replay[1] ~= 1 and replay[1] ~= 2 then return replay end
  local in_use = redis.call('ZCARD', key)
  if held then
    return {replay[1], in_use, limit, earliest_end(), tonumber(held) - now, token_of(holder), 'replayed'}
  end
  return {4, in_use, limit, earliest_end(), 0, 0, 'replayed'}
end

-- A new lease's token: after every token issued, and never below the server time in µs.
local function mint()
  local t = math.max((tonumber(redis.call('HGET', tokens, '#')) or 0) + 1, now_us)
  redis.call('HSET', tokens, '#', s(t), holder, s(t))
  return t
end

local code, token = nil, 0
if op == 'check' then
  token = token_of(holder)
  if held and token == asked and asked > 0 then
    code = 5
  elseif asked > 0 and asked <= (tonumber(redis.call('HGET', tokens, '#')) or 0) then
    code, token = 6, 0
  else
    code, token = 7, 0
  end
elseif op == 'release' then
  if held then
    token = token_of(holder)
    redis.call('ZREM', key, holder)
    redis.call('HDEL', tokens, holder)
    code = 3
  else
    code = 4
  end
elseif held then
  redis.call('ZADD', key, 'XX', s(now + lease), holder)
  token = token_of(holder)
  if token == 0 then token = mint() end -- a lease from before tokens existed
  code = 2
elseif op == 'renew' then
  code = 4
elseif redis.call('ZCARD', key) < limit then
  redis.call('ZADD', key, 'NX', s(now + lease), holder)
  token = mint()
  code = 1
else
  code = 0
end

local in_use = redis.call('ZCARD', key)
local earliest, lease_left = earliest_end(), 0
if in_use > 0 then
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  -- The set lives exactly as long as its longest lease, so idle semaphores vanish; the
  -- tokens one lease longer, so a check tells "ended" from "never held" for a while.
  redis.call('PEXPIREAT', key, s(tonumber(last[2])))
  redis.call('PEXPIREAT', tokens, s(tonumber(last[2]) + lease))
elseif redis.call('EXISTS', tokens) == 1 then
  redis.call('PEXPIRE', tokens, s(lease))
end
if code == 1 or code == 2 then lease_left = lease end
if code == 5 then lease_left = tonumber(held) - now end
return finish({code, in_use, limit, earliest, lease_left, token})
