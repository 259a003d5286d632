-- redcount: set or clear a subject's override of a quota policy's size (its limit, capacity
-- or burst): an admin action, stored in the subject's own slot and read by the take script
-- in the same call (prelude.lua: override), so a premium subject needs no redeploy.
-- KEYS[1]  the override key
-- ARGV[1]  "set" or "clear"
-- ARGV[2]  the size (1 .. 10^9; the core checks the algorithm's own bound)
-- ARGV[3]  how long it holds, in ms (0: until cleared; at most 10^12)
-- Reply: {existed}: 1 when an override was in force before this call.
-- Optional: KEYS[2] + two last ARGV make it idempotent (prelude.lua).
-- (Runs after prelude.lua: int, s, idempotency.)

local op = ARGV[1]
if op ~= 'set' and op ~= 'clear' then
  return error({err = 'ERR redcount: op must be set or clear'})
end
local size = int('limit', ARGV[2], 1, RUST.quota.MAX_LIMIT)
local ttl = int('ttl_ms', ARGV[3], 0, RUST.quota.MAX_OVERRIDE_TTL_MS)

local replay, finish = idempotency(1, 3)
if replay then return replay end

local k = KEYS[1]
local existed = redis.call('EXISTS', k)
-- A clear of nothing, or a size without expiry set to what it already is, leaves Redis as it
-- was and stores nothing (prelude: idempotency).
local changed = op == 'clear' and existed == 1
  or op == 'set' and (ttl > 0 or redis.call('PTTL', k) ~= -1 or redis.call('GET', k) ~= s(size))
if op == 'clear' then
  redis.call('DEL', k)
elseif ttl > 0 then
  redis.call('SET', k, s(size), 'PX', s(ttl))
else
  redis.call('SET', k, s(size))
end
return finish({existed}, changed)
