-- redcount: counting semaphore with one lease per holder ("at most 60 devices, 300 s lease").
-- KEYS[1]  sorted set: member = holder id, score = lease end in ms (server time)
-- ARGV[1]  op: "acquire", "renew" or "release"
-- ARGV[2]  holder id
-- ARGV[3]  limit (1 .. 10^6)
-- ARGV[4]  lease in ms (1 .. 10^10)
-- Reply: {code, in_use, limit, earliest_ms, lease_ms}
--   code: 1 acquired, 2 renewed (the holder already held a lease: acquire is idempotent),
--         0 full, 3 released, 4 not a holder (release/renew of an unknown or expired holder)
--   earliest_ms: until the earliest lease ends (-1 when nobody holds one)
--   lease_ms: until this holder's lease ends (0 when it holds none)
-- Expired leases are reclaimed on every call, so a crashed holder frees its slot when its
-- own lease ends, and one slow holder can never reset the others.
-- Optional: KEYS[2] + two last ARGV make it idempotent (prelude.lua). A replayed acquire or
-- renew tells the current truth: the lease left now, or 4 (not a holder) once it has ended;
-- a replay never grants a slot that is not held.
-- (Runs after prelude.lua: int, s, idempotency.)

local key, op, holder = KEYS[1], ARGV[1], id('holder', ARGV[2])
if op ~= 'acquire' and op ~= 'renew' and op ~= 'release' then
  return error({err = 'ERR redcount: op must be acquire, renew or release'})
end
local limit = int('limit', ARGV[3], 1, 1000000)
local lease = int('lease', ARGV[4], 1, 10000000000)

local replay, finish = idempotency(1)

local now = now_ms()
redis.call('ZREMRANGEBYSCORE', key, '-inf', s(now))
local held = redis.call('ZSCORE', key, holder)

local function earliest_end()
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if #first == 0 then return -1 end
  return tonumber(first[2]) - now
end

if replay then
  if replay[1] ~= 1 and replay[1] ~= 2 then return replay end
  local in_use = redis.call('ZCARD', key)
  if held then return {replay[1], in_use, limit, earliest_end(), tonumber(held) - now, 'replayed'} end
  return {4, in_use, limit, earliest_end(), 0, 'replayed'}
end
local code
if op == 'release' then
  if held then redis.call('ZREM', key, holder); code = 3 else code = 4 end
elseif held then
  redis.call('ZADD', key, 'XX', s(now + lease), holder)
  code = 2
elseif op == 'renew' then
  code = 4
elseif redis.call('ZCARD', key) < limit then
  redis.call('ZADD', key, 'NX', s(now + lease), holder)
  code = 1
else
  code = 0
end

local in_use = redis.call('ZCARD', key)
local earliest, lease_left = earliest_end(), 0
if in_use > 0 then
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  -- The set lives exactly as long as its longest lease, so idle semaphores vanish.
  redis.call('PEXPIREAT', key, s(tonumber(last[2])))
end
if code == 1 or code == 2 then lease_left = lease end
return finish({code, in_use, limit, earliest, lease_left})
