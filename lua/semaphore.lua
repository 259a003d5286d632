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
--   fencing_token: the lease's token (0 when none): see lib_lease.lua.
-- Expired leases are reclaimed by every call that writes (up to 250 at a time; those left
-- over count as free), so a crashed holder frees its slot when its own lease ends, and one
-- slow holder can never reset the others. A call that writes nothing (full, not a holder,
-- check) stores no reply either.
-- Optional: KEYS[4] + two last ARGV make it idempotent (prelude.lua). A replayed acquire or
-- renew tells the current truth: the lease left now, or 4 (not a holder) once it has ended,
-- also when the holder holds a later lease (another fencing token); a replay never grants a
-- slot that is not held.
-- (Runs after prelude.lua and lib_lease.lua.)

local key, tokens, op = KEYS[1], KEYS[2], ARGV[1]
if op ~= 'acquire' and op ~= 'renew' and op ~= 'release' and op ~= 'check' then
  return error({err = 'ERR redcount: op must be acquire, renew, release or check'})
end
local p = lease_args(2)
local asked = int('fencing_token', ARGV[5], 0, RUST.validate.MAX_SAFE)

local replay, finish = idempotency(3, 5)

local t = redis.call('TIME')
local now_us = t[1] * 1000000 + t[2]
local now = math.floor(now_us / 1000)
if op == 'acquire' and not replay then
  -- The decision an acquire shares with decide.lua, then this script's own reply.
  -- Full: nothing taken, nothing stored.
  local q = lease_eval(p, key, tokens, KEYS[3], now_us)
  if q.allowed then q.take() end
  local r = q.reply()
  return finish({r[1], r[3], r[2], r[4], r[6], r[7]}, q.allowed)
end

-- The semaphore's own limit, when an admin set one (prelude.lua: override).
local limit = override(KEYS[3], p.limit, RUST.semaphore.MAX_LIMIT)
lease_check(key, tokens) -- before any write (an acquire was checked in lease_eval)
local holder = p.holder
local held = tonumber(redis.call('ZSCORE', key, holder))
-- Over (reclaimed only by a call that writes).
if held and held <= now then held = nil end

if replay then
  if replay[1] ~= 1 and replay[1] ~= 2 then return replay end
  local in_use = lease_live(key, now)
  -- The replayed grant's own lease only: the holder may hold a later one (another token),
  -- which the original call did not get.
  local token = held and lease_token_of(tokens, holder) or 0
  if held and token == replay[6] then
    return {replay[1], in_use, limit, lease_earliest(key, now), held - now, token, 'replayed'}
  end
  return {4, in_use, limit, lease_earliest(key, now), 0, 0, 'replayed'}
end

-- A check, and a renewal or release by a holder without a live lease, change nothing: not
-- even ended leases' clean-up, and no reply is stored (prelude: idempotency), so sent again
-- under its key it is a new call.
if op == 'check' or not held then
  local code, token, lease_left = 4, 0, 0
  if op == 'check' then
    token = lease_token_of(tokens, holder)
    if held and token == asked and asked > 0 then
      code, lease_left = 5, held - now
    elseif asked > 0 and asked <= lease_last_token(tokens) then
      code, token = 6, 0
    else
      code, token = 7, 0
    end
  end
  return {code, lease_live(key, now), limit, lease_earliest(key, now), lease_left, token}
end

-- Read before any write: it may refuse the state.
local token = lease_token_of(tokens, holder)
lease_reclaim(key, tokens, now)
local code, lease_left = 3, 0
if op == 'release' then
  redis.call('ZREM', key, holder)
  redis.call('HDEL', tokens, holder)
else
  redis.call('ZADD', key, 'XX', s(now + p.lease), holder)
  if token == 0 then token = lease_mint(tokens, holder, now_us) end -- a lease from before tokens existed
  code, lease_left = 2, p.lease
end
lease_keep(key, tokens, p.lease)
return finish({code, lease_live(key, now), limit, lease_earliest(key, now), lease_left, token})
