-- redcount: budget leases of a fixed-window quota. A shell (the worker's isolate, `redcount
-- serve`) borrows a slice of a subject's remaining units in one call, charged at once as a take,
-- admits calls from that local stock, and gives back what it did not use. The units lent
-- and not yet given back are counted in the window's count like any take, and also recorded
-- by lease id in KEYS[3] (a hash expiring with the window), so that a reset keeps counting
-- them (quota_reset.lua), an admin refund never gives them back (quota_refund.lua: Redis cannot
-- tell a lease's used units from those its shell still holds; they are refundable once the
-- lease has ended), and a return gives back only units of its own lease, in its own window.
-- KEYS[1]  the state (lib_fixed.lua)
-- KEYS[2]  the subject's override of the limit (prelude.lua: override)
-- KEYS[3]  the units lent, by lease id (a hash; it expires with the window's count)
-- ARGV[1]  "borrow": ARGV[2] limit, ARGV[3] window in ms, ARGV[4] cost of this call (0 for
--          a renewal: a shell borrowing its next lease while the running one still admits),
--          ARGV[5] most units to lend on top of it (0 .. 10^9), ARGV[6] the new lease's id,
--          ARGV[7] (optional) the id of this shell's last lease, used up: forgotten here
--          Reply: {allowed, limit, remaining, reset_ms, retry_after_ms, lent}: the take's
--          answer (remaining after the cost and the units lent), and the units lent (0 when
--          denied). A denied call writes nothing but the forgetting of ARGV[7].
--          Adaptive: at most a quarter of what remains after the cost, so the last units of
--          a window are not stranded in one shell while others are denied.
-- ARGV[1]  "return": ARGV[2] units given back (0 .. 10^9: 0 forgets the record of a lease
--          whose units were all used), ARGV[3] the lease's id
--          Reply: {given}: at most what the lease still has on record in this window (0 when
--          its window is over or the record is gone); the record is forgotten.
-- (Runs after prelude.lua and lib_fixed.lua.)

local state, lent = KEYS[1], KEYS[3]
if #KEYS ~= 3 then return misshapen() end
if ARGV[1] == 'borrow' then
  if #ARGV ~= 6 and #ARGV ~= 7 then return misshapen() end
  local p = fixed_args(2, true)
  p.cost = int('cost', ARGV[4], 0, RUST.quota.MAX_LIMIT)
  local want = int('units', ARGV[5], 0, RUST.quota.MAX_LIMIT)
  local lease = id('lease', ARGV[6])
  if ARGV[7] then redis.call('HDEL', lent, id('last lease', ARGV[7])) end
  local q = fixed_eval(p, state, KEYS[2], now_us)
  local lend = 0
  if q.allowed then
    local rest = q.reply()[3] - p.cost
    lend = math.min(want, math.floor(rest / 4))
    p.cost = p.cost + lend
    if p.cost > 0 then q.take() end
    if lend > 0 then
      redis.call('HINCRBY', lent, lease, s(lend))
      -- The same end as the count's: a record never outlives its window.
      redis.call('PEXPIREAT', lent, redis.call('PEXPIRETIME', state))
    end
  end
  local r = q.reply()
  r[6] = lend
  return r
elseif ARGV[1] == 'return' then
  if #ARGV ~= 3 then return misshapen() end
  local units = int('units', ARGV[2], 0, RUST.quota.MAX_LIMIT)
  local lease = id('lease', ARGV[3])
  local held = stored(redis.call('HGET', lent, lease)) or 0
  local used = stored(redis.call('GET', state)) or 0
  local given = math.max(0, math.min(units, held, used))
  if given > 0 then redis.call('DECRBY', state, s(given)) end -- the key keeps its expiry
  if held ~= 0 then redis.call('HDEL', lent, lease) end
  return {given}
end
return error({err = 'ERR redcount: op must be borrow or return'})
