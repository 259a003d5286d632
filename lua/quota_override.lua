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
local size = int('limit', ARGV[2], 1, 1000000000)
local ttl = int('ttl_ms', ARGV[3], 0, 1000000000000)

local replay, finish = idempotency(1, 3)
if replay then return replay end

local existed = redis.call('EXISTS', KEYS[1])
-- A clear of nothing, or a size without expiry set to what it already is, changes nothing
-- and stores nothing (prelude: idempotency).
if existed == 0 and op == 'clear' then return {0} end
if existed == 1 and op == 'set' and ttl == 0 and redis.call('PTTL', KEYS[1]) == -1
  and redis.call('TYPE', KEYS[1]).ok == 'string' and redis.call('GET', KEYS[1]) == s(size) then
  return {1}
end
if op == 'clear' then
  redis.call('DEL', KEYS[1])
elseif ttl > 0 then
  redis.call('SET', KEYS[1], s(size), 'PX', s(ttl))
else
  redis.call('SET', KEYS[1], s(size))
end
return finish({existed})
